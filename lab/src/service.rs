//! The service section: `tollgate-server` under load over loopback, in
//! memory and on a real Redis in each of its three modes, against
//! Kuadrant's limitador library behind the same gRPC front
//! (`tollgate-limitador-front`) in memory, on Redis and on its cached
//! Redis; then three processes of each on one Redis, admitting against a
//! limit.
//!
//! Every server process (and Redis) runs pinned to CPU 1, the load
//! generator (`tollgate_server::load`, in this process) to CPU 0. Each
//! measurement runs in interleaved rounds (every variant once per round,
//! the order rotated each round) and is reported as the median of the
//! rounds and its 95 % interval (`stats::median_ci`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::runtime::Runtime;
use tollgate_server::load::Load;

use crate::redis_server::RedisServer;
use crate::stats::median_ci;

/// How long each cell runs, and how many rounds.
pub struct Budget {
    pub cell: Duration,
    pub rounds: usize,
    /// Whether to build limitador's front when it is not built yet (its
    /// RocksDB takes minutes): with `--full` and `--service`; the quick
    /// report uses it when it is there.
    pub build_limitador: bool,
}

/// The in-memory target: at least this many decisions a second, and a p99
/// under 1 ms at half of it.
const TARGET_RATE: u64 = 50_000;

/// The admitted workload's limit, far above the load: every call a full
/// decision that admits (GCRA, a million a second).
const UNLIMITED: u64 = 1_000_000;

/// The hot workload's limit: far below the load, so that most calls are
/// denied (GCRA, a hundred a second). The deny cache and leases serve the
/// time between a drained key's units, less a call's flight: 10 ms here,
/// against flights of 0.2 ms to several under load (at a thousand a
/// second, 1 ms between units, most checks ask Redis: notes/15).
const HOT: u64 = 100;

/// The limit three processes share in the admissions table: a day's, so
/// that nothing comes back within the run.
const SHARED_LIMIT: u64 = 1_000;

/// A server process, killed when dropped.
struct Process {
    child: Child,
    address: String,
    /// `tollgate-server`'s HTTP side (`/metrics`).
    http: Option<String>,
    config: Option<PathBuf>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(config) = &self.config {
            let _ = std::fs::remove_file(config);
        }
    }
}

/// Starts `binary` with `args` on CPU 1 (`taskset`, which the lab's other
/// sections use too), reading the address it prints after `prefix`.
fn spawn(binary: &Path, args: &[String], prefix: &str) -> Result<(Child, String), String> {
    // Started on CPU 1 (rather than moved there): its runtime then sizes
    // its worker threads to the one CPU it has.
    let mut child = Command::new("taskset")
        .args(["-c", "1"])
        .arg(binary)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| format!("starting {}: {error}", binary.display()))?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no standard output")?;
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|error| format!("reading {}: {error}", binary.display()))?;
    let Some(address) = line.trim().strip_prefix(prefix) else {
        let _ = child.kill();
        let status = child.wait().map(|status| status.to_string());
        return Err(format!(
            "{} printed {line:?} ({status:?})",
            binary.display()
        ));
    };
    Ok((child, address.to_owned()))
}

/// Pins process `pid` (every thread) to `cpu`; whether it took.
fn pin_to(pid: u32, cpu: u32) -> bool {
    Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// One limit per tollgate mode in `domain`, GCRA: `requests` a `unit` on
/// keys `exact`, `cached` and `leased`, and `hot` a `unit` on the same
/// keys prefixed `hot_`.
fn config(domain: &str, requests: u64, hot: u64, unit: &str) -> String {
    let mut yaml = format!("domain: {domain}\ndescriptors:\n");
    for (prefix, requests) in [("", requests), ("hot_", hot)] {
        for (key, mode) in [
            ("exact", "exact"),
            ("cached", "deny_cached"),
            ("leased", "leased"),
        ] {
            yaml.push_str(&format!(
                "  - key: {prefix}{key}\n    rate_limit:\n      unit: {unit}\n      \
                 requests_per_unit: {requests}\n      algorithm: gcra\n      mode: {mode}\n"
            ));
        }
    }
    yaml
}

/// A `tollgate-server` on `yaml`, on Redis at `redis` if given.
fn tollgate(binary: &Path, yaml: &str, redis: Option<&str>) -> Result<Process, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let file = std::env::temp_dir().join(format!(
        "tollgate-lab-service-{}-{}.yaml",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&file, yaml).map_err(|error| format!("{}: {error}", file.display()))?;
    let mut args: Vec<String> = [
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--watch-ms",
        "60000",
        "--config",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(file.display().to_string());
    if let Some(url) = redis {
        args.extend(["--redis".to_owned(), url.to_owned()]);
    }
    let (child, line) = spawn(binary, &args, "tollgate-server listening on ")?;
    let (address, http) = line
        .strip_suffix(" (HTTP)")
        .and_then(|rest| rest.split_once(" (gRPC) and "))
        .ok_or_else(|| format!("tollgate-server printed {line:?}"))?;
    Ok(Process {
        child,
        address: address.to_owned(),
        http: Some(http.to_owned()),
        config: Some(file),
    })
}

/// A `tollgate-limitador-front` with `storage`, each of `limits` (domain,
/// count, window in seconds) on key `hot` of its domain.
fn limitador(
    binary: &Path,
    storage: &str,
    redis: &str,
    limits: &[(&str, u64, u64)],
) -> Result<Process, String> {
    let mut args: Vec<String> = [
        "--grpc-addr",
        "127.0.0.1:0",
        "--storage",
        storage,
        "--redis",
        redis,
    ]
    .map(str::to_owned)
    .to_vec();
    for (domain, count, seconds) in limits {
        args.push("--limit".to_owned());
        args.push(format!("{domain}:hot:{count}:{seconds}"));
    }
    let (child, address) = spawn(binary, &args, "limitador-front listening on ")?;
    Ok(Process {
        child,
        address,
        http: None,
        config: None,
    })
}

/// `tollgate-server`, next to the lab's own binary: built by cargo (a
/// no-op when fresh) when the lab runs under cargo.
fn server_binary() -> Result<PathBuf, String> {
    crate::distributed::workspace_binary("tollgate-server", "tollgate-server")
}

/// `tollgate-limitador-front`: a workspace of its own (limitador needs
/// RocksDB to compile), built in release into `target/limitador-front`
/// when `build` says so (a no-op when fresh).
fn limitador_binary(build: bool) -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = root.join("target").join("limitador-front");
    let binary = target.join("release").join("tollgate-limitador-front");
    if !build && !binary.is_file() {
        return Err(
            "not built: `--service` or `--full` builds it (RocksDB's C++ with it: 13 minutes on the \
             2-core VM)"
                .to_owned(),
        );
    }
    if let Some(cargo) = std::env::var_os("CARGO") {
        let status = Command::new(cargo)
            .args(["build", "--quiet", "--release", "--manifest-path"])
            .arg(root.join("peers/limitador-front/Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .status()
            .map_err(|error| format!("running cargo: {error}"))?;
        if !status.success() {
            return Err(format!("building tollgate-limitador-front: {status}"));
        }
    }
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!("{} is missing", binary.display()))
    }
}

/// A variant of the throughput and latency tables.
struct Variant {
    name: &'static str,
    address: String,
    /// The domain and descriptor key of the admitted and the hot
    /// workload.
    keys: [(&'static str, &'static str); 2],
    /// Whether Redis's commands count against it.
    on_redis: bool,
    /// Where tollgate's own count of round trips is read: its server's
    /// `/metrics`.
    metrics: Option<String>,
}

/// The two workloads: every call admitted, or most denied.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    Admitted,
    Hot,
}

impl Workload {
    fn target(self, variant: &Variant) -> (&'static str, &'static str) {
        variant.keys[usize::from(self == Workload::Hot)]
    }
}

/// What a cell measured.
#[derive(Clone, Copy, Default)]
struct Cell {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// Redis commands a decision, as Redis counts them (a script's own
    /// included).
    commands: f64,
    /// Round trips a decision, as tollgate counts them.
    round_trips: f64,
    errors: u64,
}

/// Redis's `total_commands_processed`; `None` when it cannot be read.
fn commands(redis: Option<&RedisServer>) -> Option<u64> {
    redis
        .and_then(|server| crate::redis_server::command(server.port(), &["INFO", "stats"]).ok())
        .and_then(|info| {
            info.lines().find_map(|line| {
                line.strip_prefix("total_commands_processed:")
                    .and_then(|count| count.trim().parse().ok())
            })
        })
}

/// The script calls tollgate's limiter of `key` sent, from its server's
/// `/metrics`; `None` when they cannot be read.
fn round_trips(runtime: &Runtime, metrics: &str, key: &str) -> Option<u64> {
    let sample = format!("tollgate_redis_calls_total{{limiter=\"bench.{key}\"}} ");
    runtime
        .block_on(async {
            reqwest::get(format!("http://{metrics}/metrics"))
                .await
                .ok()?
                .text()
                .await
                .ok()
        })
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix(&sample)?.trim().parse().ok())
        })
}

fn measure(
    runtime: &Runtime,
    (variant, workload): (&Variant, Workload),
    rate: u64,
    budget: &Budget,
    redis: Option<&RedisServer>,
) -> Cell {
    let (domain, key) = workload.target(variant);
    let load = Load {
        target: variant.address.clone(),
        domain: domain.to_owned(),
        key: key.to_owned(),
        values: 1,
        connections: 4,
        streams: 32,
        rate,
        warm_up: Duration::ZERO,
        measure: budget.cell,
    };
    let calls = |runtime| {
        variant
            .metrics
            .as_deref()
            .and_then(|metrics| round_trips(runtime, metrics, key))
    };
    // A warm-up of its own, so that the counts read after it are the
    // measured calls' alone.
    let warm_up = Load {
        measure: Duration::from_millis(200),
        ..load.clone()
    };
    let Ok(_) = runtime.block_on(warm_up.run()) else {
        return Cell {
            errors: 1,
            ..Cell::default()
        };
    };
    let (commands_before, calls_before) = (commands(redis), calls(runtime));
    let Ok(seen) = runtime.block_on(load.run()) else {
        return Cell {
            errors: 1,
            ..Cell::default()
        };
    };
    // The INFO that read `commands_before` is counted too. A count that
    // could not be read is NaN, never 0: it must not meet a target.
    #[allow(clippy::cast_precision_loss)]
    let decisions = (seen.ok + seen.over_limit).max(1) as f64;
    #[allow(clippy::cast_precision_loss)]
    let per_decision = |before: Option<u64>, after: Option<u64>, extra: u64| match (before, after) {
        (Some(before), Some(after)) => after.saturating_sub(before + extra) as f64 / decisions,
        _ => f64::NAN,
    };
    #[allow(clippy::cast_precision_loss)]
    Cell {
        rate: seen.decisions_per_second(load.measure),
        p50_us: f64::from(seen.quantile_us(0.50)),
        p99_us: f64::from(seen.quantile_us(0.99)),
        p999_us: f64::from(seen.quantile_us(0.999)),
        commands: per_decision(commands_before, commands(redis), 1),
        round_trips: per_decision(calls_before, calls(runtime), 0),
        errors: seen.errors,
    }
}

/// Every variant once a round, the order rotated each round, each at its
/// rate; each variant's cells.
fn rounds(
    runtime: &Runtime,
    (variants, workload): (&[Variant], Workload),
    rates: &[u64],
    budget: &Budget,
    redis: Option<&RedisServer>,
) -> Vec<Vec<Cell>> {
    let mut cells = vec![Vec::new(); variants.len()];
    for round in 0..budget.rounds {
        for offset in 0..variants.len() {
            let index = (round + offset) % variants.len();
            cells[index].push(measure(
                runtime,
                (&variants[index], workload),
                rates[index],
                budget,
                redis,
            ));
        }
    }
    cells
}

fn estimate(cells: &[Cell], field: fn(&Cell) -> f64, decimals: usize) -> String {
    let mut values: Vec<f64> = cells.iter().map(field).collect();
    median_ci(&mut values).show(decimals)
}

fn median_of(cells: &[Cell], field: fn(&Cell) -> f64) -> f64 {
    let mut values: Vec<f64> = cells.iter().map(field).collect();
    median_ci(&mut values).median
}

pub fn run(budget: &Budget) {
    println!("# The service: tollgate-server and limitador under load over loopback\n");
    let server = match server_binary() {
        Ok(binary) => binary,
        Err(error) => {
            println!("Skipped: {error}\n");
            return;
        }
    };
    let redis = match RedisServer::start() {
        Ok(redis) => {
            pin_to(redis.pid(), 1);
            Some(redis)
        }
        Err(error) => {
            println!("Redis could not start ({error}): in memory only.\n");
            None
        }
    };
    let limitador_front = match limitador_binary(budget.build_limitador) {
        Ok(binary) => Some(binary),
        Err(error) => {
            println!("limitador's rows are missing: {error}\n");
            None
        }
    };
    let pinned = pin_to(std::process::id(), 0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let url = redis
        .as_ref()
        .map(|server| format!("redis://127.0.0.1:{}/", server.port()));
    let started = start_variants(&server, limitador_front.as_deref(), url.as_deref());
    let (variants, _processes) = match started {
        Ok(started) => started,
        Err(error) => {
            println!("Skipped: {error}\n");
            return;
        }
    };
    println!(
        "Servers and Redis on CPU 1 (each started there), the load generator on CPU 0{}; one hot\n\
         descriptor. {} interleaved rounds of {:?} a cell, the order rotated each round: the median of\n\
         the rounds and its 95 % interval, each cell after a warm-up of its own. Round trips: tollgate's\n\
         count; Redis commands: Redis's (a script's own commands included).\n",
        if pinned {
            ""
        } else {
            " (pinning failed: shared cores)"
        },
        budget.rounds,
        budget.cell
    );
    let closed = vec![0; variants.len()];
    println!(
        "## Closed loop, every call admitted (GCRA, {UNLIMITED} a second), 4 connections × 32 streams"
    );
    let admitted = rounds(
        &runtime,
        (&variants, Workload::Admitted),
        &closed,
        budget,
        redis.as_ref(),
    );
    table(&variants, &admitted);
    println!("(target: tollgate in memory at least {TARGET_RATE} a second)\n");
    println!("## Closed loop, a hot descriptor (GCRA, {HOT} a second: most calls denied)");
    let hot = rounds(
        &runtime,
        (&variants, Workload::Hot),
        &closed,
        budget,
        redis.as_ref(),
    );
    table(&variants, &hot);
    println!(
        "(target: tollgate leased within 1.5× of tollgate in memory, at most 0.01 round trips a decision)\n"
    );
    // Half of each variant's own rate, and at most half the target.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rates: Vec<u64> = admitted
        .iter()
        .map(|cells| ((median_of(cells, |cell| cell.rate) / 2.0) as u64).clamp(1, TARGET_RATE / 2))
        .collect();
    println!(
        "## Open loop, every call admitted: half of each variant's closed-loop rate (at most {}), evenly\n   spaced, each call timed from its scheduled instant (no coordinated omission)",
        TARGET_RATE / 2
    );
    let open = rounds(
        &runtime,
        (&variants, Workload::Admitted),
        &rates,
        budget,
        redis.as_ref(),
    );
    table(&variants, &open);
    println!(
        "(target: tollgate in memory p99 under 1 000 µs at {} a second)\n",
        TARGET_RATE / 2
    );
    if let Some(url) = &url {
        admissions(&runtime, &server, limitador_front.as_deref(), url, budget);
    }
}

/// The processes of the throughput and latency tables, and their variants.
fn start_variants(
    server: &Path,
    limitador_front: Option<&Path>,
    url: Option<&str>,
) -> Result<(Vec<Variant>, Vec<Process>), String> {
    let yaml = config("bench", UNLIMITED, HOT, "second");
    let mut processes = Vec::new();
    let mut variants = Vec::new();
    let memory = tollgate(server, &yaml, None)?;
    variants.push(Variant {
        name: "tollgate, in memory",
        address: memory.address.clone(),
        keys: [("bench", "exact"), ("bench", "hot_exact")],
        on_redis: false,
        metrics: None,
    });
    processes.push(memory);
    if let Some(url) = url {
        let on_redis = tollgate(server, &yaml, Some(url))?;
        for (name, keys) in [
            ("tollgate, Redis exact", ["exact", "hot_exact"]),
            ("tollgate, Redis deny-cached", ["cached", "hot_cached"]),
            ("tollgate, Redis leased", ["leased", "hot_leased"]),
        ]
        .map(|(name, [admitted, hot])| (name, [("bench", admitted), ("bench", hot)]))
        {
            variants.push(Variant {
                name,
                address: on_redis.address.clone(),
                keys,
                on_redis: true,
                metrics: on_redis.http.clone(),
            });
        }
        processes.push(on_redis);
    }
    if let Some(binary) = limitador_front {
        let storages: &[(&'static str, &str)] = if url.is_some() {
            &[
                ("limitador, in memory", "memory"),
                ("limitador, Redis", "redis"),
                ("limitador, cached Redis", "cached"),
            ]
        } else {
            &[("limitador, in memory", "memory")]
        };
        for &(name, storage) in storages {
            // limitador's limits are fixed windows: the admitted one a
            // million a second, the hot one a hundred.
            let process = limitador(
                binary,
                storage,
                url.unwrap_or("redis://127.0.0.1:1/"),
                &[("bench", UNLIMITED, 1), ("hot", HOT, 1)],
            )?;
            variants.push(Variant {
                name,
                address: process.address.clone(),
                keys: [("bench", "hot"), ("hot", "hot")],
                on_redis: storage != "memory",
                metrics: None,
            });
            processes.push(process);
        }
    }
    Ok((variants, processes))
}

fn table(variants: &[Variant], cells: &[Vec<Cell>]) {
    println!(
        "{:<28} {:>22} {:>18} {:>20} {:>20} {:>24} {:>24}",
        "variant",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "round trips/decision",
        "Redis commands/decision"
    );
    for (variant, cells) in variants.iter().zip(cells) {
        let errors: u64 = cells.iter().map(|cell| cell.errors).sum();
        println!(
            "{:<28} {:>22} {:>18} {:>20} {:>20} {:>24} {:>24}{}",
            variant.name,
            estimate(cells, |cell| cell.rate, 0),
            estimate(cells, |cell| cell.p50_us, 0),
            estimate(cells, |cell| cell.p99_us, 0),
            estimate(cells, |cell| cell.p999_us, 0),
            if variant.metrics.is_some() {
                estimate(cells, |cell| cell.round_trips, 4)
            } else {
                "-".to_owned()
            },
            if variant.on_redis {
                estimate(cells, |cell| cell.commands, 3)
            } else {
                "-".to_owned()
            },
            if errors > 0 {
                format!("  ({errors} errors)")
            } else {
                String::new()
            }
        );
    }
}

/// Three processes of each backend on one Redis (in memory: each its own),
/// a hot descriptor limited to `SHARED_LIMIT` a day, each process called
/// by 16 streams at once for a cell: the calls admitted against the limit.
fn admissions(
    runtime: &Runtime,
    server: &Path,
    limitador_front: Option<&Path>,
    url: &str,
    budget: &Budget,
) {
    println!(
        "## Three processes, one limit of {SHARED_LIMIT} a day: admitted against it (16 streams each, {:?})",
        budget.cell
    );
    println!(
        "{:<30} {:>10} {:>10} {:>12}",
        "backend", "admitted", "limit", "over (%)"
    );
    let mut rows: Vec<(&str, Result<u64, String>)> = Vec::new();
    for (index, (name, key, redis)) in [
        ("tollgate, in memory", "exact", false),
        ("tollgate, Redis exact", "exact", true),
        ("tollgate, Redis deny-cached", "cached", true),
        ("tollgate, Redis leased", "leased", true),
    ]
    .into_iter()
    .enumerate()
    {
        let domain = format!("shared{index}");
        let yaml = config(&domain, SHARED_LIMIT, SHARED_LIMIT, "day");
        let started: Result<Vec<Process>, String> = (0..3)
            .map(|_| tollgate(server, &yaml, redis.then_some(url)))
            .collect();
        rows.push((
            name,
            started.map(|processes| admitted(runtime, &processes, &domain, key, budget)),
        ));
    }
    if let Some(binary) = limitador_front {
        for (index, (name, storage)) in [
            ("limitador, in memory", "memory"),
            ("limitador, Redis", "redis"),
            ("limitador, cached Redis", "cached"),
        ]
        .into_iter()
        .enumerate()
        {
            let domain = format!("limitador{index}");
            let started: Result<Vec<Process>, String> = (0..3)
                .map(|_| limitador(binary, storage, url, &[(&domain, SHARED_LIMIT, 86_400)]))
                .collect();
            rows.push((
                name,
                started.map(|processes| admitted(runtime, &processes, &domain, "hot", budget)),
            ));
        }
    }
    for (name, admitted) in rows {
        match admitted {
            Ok(admitted) => {
                #[allow(clippy::cast_precision_loss)]
                let over = (admitted as f64 / SHARED_LIMIT as f64 - 1.0) * 100.0;
                println!("{name:<30} {admitted:>10} {SHARED_LIMIT:>10} {over:>12.1}");
            }
            Err(error) => println!("{name:<30} not measured: {error}"),
        }
    }
    println!(
        "(target: zero over-admission on Redis in every tollgate mode; leases held unspent when the load stops\n are under-admission; limitador's cached storage counts locally and flushes to Redis in batches)\n"
    );
}

/// The calls `processes` admitted of `domain`'s hot descriptor, each
/// called by 16 streams at once for a cell.
fn admitted(
    runtime: &Runtime,
    processes: &[Process],
    domain: &str,
    key: &str,
    budget: &Budget,
) -> u64 {
    runtime.block_on(async {
        let loads: Vec<_> = processes
            .iter()
            .map(|process| Load {
                target: process.address.clone(),
                domain: domain.to_owned(),
                key: key.to_owned(),
                values: 1,
                connections: 1,
                streams: 16,
                rate: 0,
                warm_up: Duration::ZERO,
                measure: budget.cell,
            })
            .collect();
        let seen = futures_util::future::join_all(loads.iter().map(Load::run)).await;
        seen.into_iter()
            .map(|seen| seen.map_or(0, |seen| seen.ok))
            .sum()
    })
}
