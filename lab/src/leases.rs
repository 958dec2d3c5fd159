//! Deciding locally (notes/12): three `tollgate-instance`
//! processes on one real Redis, in each mode: the three-instance break
//! again, round trips per check on a hot key, admissions against the
//! limit over the run, the local check's cost against the in-process
//! lock-free check in the same processes, and what happens when Redis dies.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::instances::{Instance, admitted_in_turn};
use crate::redis_server::RedisServer;
use crate::stats::{quartiles, spread};

/// The hot key's quota: 1 000 a second (1 ms an interval), bursts of 1 000.
const LIMIT: u32 = 1_000;
const WINDOW_MS: u64 = 1_000;
const BURST: u64 = 1_000;
const INTERVAL_US: u64 = 1_000;

const MODES: [&str; 3] = ["exact", "deny-cached", "leased"];

/// How long each run lasts, and how many pairs of rounds the cost takes.
pub struct Budget {
    pub run: Duration,
    pub pairs: usize,
}

/// One `tollgate-instance hammer` process: commands in, a line out each.
struct Hammer {
    child: Child,
    input: ChildStdin,
    output: std::io::Lines<BufReader<ChildStdout>>,
}

impl Hammer {
    fn start(
        binary: &Path,
        url: &str,
        mode: &str,
        limit: u32,
        window_ms: u64,
        budget: &Budget,
        run: Duration,
    ) -> Self {
        let mut child = Command::new(binary)
            .args([
                "hammer",
                url,
                mode,
                &limit.to_string(),
                &window_ms.to_string(),
                &run.as_millis().to_string(),
                &budget.pairs.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("spawning {}: {error}", binary.display()));
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped")).lines();
        Self {
            child,
            input,
            output,
        }
    }

    fn send(&mut self, command: &str) {
        writeln!(self.input, "{command}").expect("writing to an instance");
    }

    fn reply(&mut self) -> String {
        self.output
            .next()
            .expect("an instance's reply")
            .expect("reading an instance")
    }
}

impl Drop for Hammer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `command` to every instance at once, and collects their replies.
fn all(hammers: &mut [Hammer], command: &str) -> Vec<String> {
    for hammer in hammers.iter_mut() {
        hammer.send(command);
    }
    hammers.iter_mut().map(Hammer::reply).collect()
}

/// Three processes in `mode` on the flushed server, sent `command`: the
/// processes, their summed checks, admissions and round trips, and how
/// long the run lasted on the server's clock (µs).
fn measured(
    binary: &Path,
    url: &str,
    connection: &mut redis::Connection,
    mode: &str,
    budget: &Budget,
    command: &str,
) -> (Vec<Hammer>, [f64; 3], u64) {
    let _: () = redis::cmd("FLUSHALL").query(connection).expect("FLUSHALL");
    let mut hammers: Vec<Hammer> = (0..3)
        .map(|_| Hammer::start(binary, url, mode, LIMIT, WINDOW_MS, budget, budget.run))
        .collect();
    let started_us = server_time(connection);
    let replies = all(&mut hammers, command);
    let span_us = server_time(connection) - started_us;
    let mut sums = [0.0; 4];
    for line in &replies {
        for (sum, value) in sums.iter_mut().zip(numbers(line)) {
            *sum += value;
        }
    }
    let [checks, admitted, calls, errors] = sums;
    assert!(errors == 0.0, "{mode}: {errors} checks failed");
    (hammers, [checks, admitted, calls], span_us)
}

fn numbers(line: &str) -> Vec<f64> {
    line.split([' ', ','])
        .filter_map(|word| word.parse().ok())
        .collect()
}

/// The server's clock, µs.
fn server_time(connection: &mut redis::Connection) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(connection).expect("TIME");
    seconds * 1_000_000 + micros
}

pub fn run(binary: &Path, budget: &Budget, pin: impl Fn(u32) -> bool) {
    println!("## Deciding locally: a deny cache and leases (three processes, one Redis)\n");
    let mut server = match RedisServer::start() {
        Ok(server) => server,
        Err(error) => {
            println!("Skipped: {error}\n");
            return;
        }
    };
    let pinned = pin(server.pid());
    let url = format!("redis://127.0.0.1:{}/", server.port());
    let client = redis::Client::open(url.as_str()).expect("a client");
    let mut connection = client.get_connection().expect("connecting");
    println!(
        "A fresh redis-server{}; the three processes share CPU 0 with the lab.\n",
        if pinned { " pinned to CPU 1" } else { "" }
    );

    println!("### The break, with each mode\n");
    println!("100 an hour, 1 000 requests sent one at a time to each instance in turn:\n");
    println!("| mode | admitted | limit | round trips for 1 000 checks |");
    println!("|---|---:|---:|---:|");
    for mode in MODES {
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut connection)
            .expect("FLUSHALL");
        let instances: Vec<Instance> = (0..3)
            .map(|_| Instance::start_with(binary, Some((&url, mode))))
            .collect();
        let (admitted, calls) = admitted_in_turn(&instances, 1_000);
        println!(
            "| {mode} | {admitted} | 100 | {} ({}) |",
            calls.iter().sum::<u64>(),
            calls
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" + ")
        );
    }

    println!(
        "\n### A hot key\n\n{LIMIT} a second in bursts of {BURST}; each process checks one key as fast as \
         it can (one task), for {:?}:\n",
        budget.run
    );
    println!(
        "| mode | checks | checks/s | round trips per check | admitted | limit over the run | over | under |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut judged = Vec::new();
    let mut costs = Vec::new();
    for mode in MODES {
        let (mut hammers, [checks, admitted, calls], span_us) =
            measured(binary, &url, &mut connection, mode, budget, "run");
        let limit = BURST + span_us / INTERVAL_US;
        let admitted = admitted as u64;
        let over = admitted.saturating_sub(limit);
        let under = limit.saturating_sub(admitted);
        println!(
            "| {mode} | {checks:.0} | {:.0} k | {:.4} | {admitted} | {limit} | {over} | {under} ({:.1} %) |",
            checks / span_us as f64 * 1e3,
            calls / checks,
            under as f64 / limit as f64 * 100.0
        );
        judged.push((format!("{mode}: no over-admission"), over == 0));
        if mode == "leased" {
            judged.push((
                "leased: at most 0.01 round trips per check".to_owned(),
                calls / checks <= 0.01,
            ));
        }
        if mode != "exact" {
            costs.push(cost(&mut hammers, mode, &mut judged));
        }
    }
    println!(
        "\n### A key below its limit\n\nThe same quota; each process checks once every 4 ms (250 a \
         second, three-quarters of the quota together). Every check should be admitted: a \
         denial here is a unit stranded (leased and expired unspent) or a lease's units held \
         by another process.\n"
    );
    println!(
        "| mode | checks | round trips per check | denied | admitted | limit over the run | over |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for mode in ["deny-cached", "leased", "leased:100"] {
        let (_, [checks, admitted, calls], span_us) =
            measured(binary, &url, &mut connection, mode, budget, "paced 4000000");
        let limit = BURST + span_us / INTERVAL_US;
        let admitted = admitted as u64;
        let slack = mode
            .strip_prefix("leased:")
            .map_or(0, |slack| slack.parse().unwrap_or(0));
        println!(
            "| {mode} | {checks:.0} | {:.3} | {:.0} | {admitted} | {limit} | {} |",
            calls / checks,
            checks - admitted as f64,
            admitted.saturating_sub(limit)
        );
        judged.push((
            format!("{mode}, below the limit: no over-admission beyond the slack"),
            admitted <= limit + slack,
        ));
    }
    println!(
        "\n### A check decided locally\n\nIn the same processes, interleaved pairs of rounds of 200 \
         checks on the hot key: the Redis limiter, and an in-process lock-free limiter with the \
         same quota (keyed GCRA, the default store and clock). Rounds in which a check took a \
         round trip are left out of the local cost; the last column keeps them. Median \
         (interquartile range) of the paired ratios.\n"
    );
    println!("| mode | local check | in-process check | local / in-process | with round trips |");
    println!("|---|---:|---:|---:|---:|");
    for row in costs {
        println!("{row}");
    }
    println!();

    // The local path's rounds run on both CPUs (Redis idle meanwhile): its
    // two-thread rows measure two threads at once, not one CPU shared.
    let spread = lab_on("0,1");
    local_costs(&url, budget.pairs, spread);
    if pinned {
        lab_on("0");
    }

    println!("### Redis dies\n");
    println!(
        "Three leased processes check one key as fast as they can; 150 ms in, the lab kills \
         redis-server (SIGKILL). The failure policy is `Error`. Summed over the three:\n"
    );
    println!(
        "| quota | answered by Redis | then locally: admitted | denied | then by the policy | ms from Redis's last answer to the policy's first (each) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    // The hot key (drained: its floors deny until the next unit refills,
    // a millisecond, and then only Redis can say); a key drained for an
    // hour (its floors deny on: Redis would too); a key far below its
    // limit (ten million an hour: each process holds a lease, which it
    // spends, and then only Redis can say).
    for (label, limit, window_ms) in [
        ("1 000 a second (the hot key)", LIMIT, WINDOW_MS),
        ("1 000 an hour", 1_000, 3_600_000),
        ("10 000 000 an hour", 10_000_000, 3_600_000),
    ] {
        let _: () = redis::cmd("FLUSHALL")
            .query(&mut connection)
            .expect("FLUSHALL");
        let run = Duration::from_millis(1_000);
        let mut hammers: Vec<Hammer> = (0..3)
            .map(|_| Hammer::start(binary, &url, "leased", limit, window_ms, budget, run))
            .collect();
        for hammer in &mut hammers {
            hammer.send("outage");
        }
        std::thread::sleep(Duration::from_millis(150));
        server.kill();
        let replies: Vec<String> = hammers.iter_mut().map(Hammer::reply).collect();
        let mut sums = [0.0; 4];
        let mut gaps = Vec::new();
        for reply in &replies {
            let fields: Vec<&str> = reply.split(' ').collect();
            for (sum, field) in sums.iter_mut().zip(&fields) {
                *sum += field.parse::<f64>().unwrap_or(0.0);
            }
            gaps.push(fields.get(4).copied().unwrap_or("-").to_owned());
        }
        println!(
            "| {label} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
            sums[0],
            sums[1],
            sums[2],
            sums[3],
            gaps.join(", ")
        );
        server.restart().expect("restarting redis-server");
        pin(server.pid());
        connection = client.get_connection().expect("connecting again");
    }
    println!();
    for (target, met) in judged {
        println!("- {target}: {}", if met { "met" } else { "missed" });
    }
    println!();
}

/// The `cost` pairs of every process: the Redis limiter's check against
/// the in-process lock-free one, in rounds of 200 checks; a table row.
fn cost(hammers: &mut [Hammer], mode: &str, judged: &mut Vec<(String, bool)>) -> String {
    let replies = all(hammers, "cost");
    let (mut local, mut in_process, mut ratios, mut all_in) = (vec![], vec![], vec![], vec![]);
    for line in &replies {
        for pair in line.split(' ') {
            let values = numbers(pair);
            let [redis_ns, in_process_ns, calls] = values[..] else {
                continue;
            };
            all_in.push(redis_ns / in_process_ns);
            if calls == 0.0 {
                local.push(redis_ns);
                in_process.push(in_process_ns);
                ratios.push(redis_ns / in_process_ns);
            }
        }
    }
    let (local_ns, ..) = spread(&mut local);
    let (in_process_ns, ..) = spread(&mut in_process);
    let (ratio, low, high) = quartiles(&mut ratios);
    let (all_in_ratio, ..) = spread(&mut all_in);
    judged.push((
        format!("{mode}: a local check within 2× the in-process lock-free check"),
        ratio <= 2.0,
    ));
    format!(
        "| {mode} | {local_ns:.1} ns | {in_process_ns:.1} ns | **{ratio:.2}×** ({low:.2}–{high:.2}; {} pairs) | {all_in_ratio:.2}× |",
        ratios.len()
    )
}

/// Checks a thread makes in a round of [`local_pairs`].
const LOCAL_CHECKS: u32 = 20_000;

/// Local checks of deny-cached limiters on drained keys, in this process:
/// counted for metrics (`Builder::metrics`) against the same uncounted,
/// and a check carrying its quota against one of the limiter's own.
fn local_costs(url: &str, pairs: usize, spread: bool) {
    use tollgate::Quota;
    use tollgate_redis::{Connection, Mode, RedisLimiter};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let quota = Quota::per_hour(1).expect("a quota");
    let tier = Quota::per_hour(2).expect("a quota");
    let limiters = runtime.block_on(async {
        let mut limiters = Vec::new();
        for counted in [false, true] {
            let connection = Connection::open(url).await.expect("connecting");
            let mut builder =
                RedisLimiter::builder(format!("lab-local-{counted}"), quota).mode(Mode::DenyCached);
            if counted {
                builder = builder.metrics();
            }
            let limiter = builder.build(connection).expect("a limiter");
            // Each thread's keys drained, and their denials learnt: by the
            // limiter's quota, and by the tier's.
            for key in ["a", "b"] {
                while limiter.check(key).await.expect("a check").is_allowed() {}
                let _ = limiter.check(key).await.expect("a check");
            }
            for key in ["tier-a", "tier-b"] {
                let check = || limiter.check_with(key, &tier);
                while check().await.expect("a check").is_allowed() {}
                let _ = check().await.expect("a check");
            }
            limiters.push(limiter);
        }
        limiters
    });
    println!(
        "### Counting for metrics on the local path\n\nA deny-cached limiter on drained keys \
         (each check denied by the local half, no round trip), built with and without \
         `Builder::metrics`, in the lab's process{}: {pairs} interleaved pairs of rounds of \
         {LOCAL_CHECKS} checks a thread (a round's time is its slowest thread's). Per check, \
         the median; the ratio, the median of the paired ratios and its 95 % interval.\n",
        if spread {
            ", its threads on both CPUs"
        } else {
            ""
        }
    );
    println!("| threads | uncounted | counted | counted / uncounted |");
    println!("|---:|---:|---:|---:|");
    let own = |limiter| Subject {
        limiter,
        keys: ["a", "b"],
        carried: None,
    };
    local_pairs(pairs, own(&limiters[0]), own(&limiters[1]));
    println!(
        "### A check carrying its quota on the local path\n\nThe uncounted limiter above: its \
         own quota's drained keys, and keys drained by checks carrying another quota \
         (`check_with`), each denied locally; as above.\n"
    );
    println!("| threads | own quota | carried quota | carried / own |");
    println!("|---:|---:|---:|---:|");
    local_pairs(
        pairs,
        own(&limiters[0]),
        Subject {
            limiter: &limiters[0],
            keys: ["tier-a", "tier-b"],
            carried: Some(tier),
        },
    );
}

/// Sets every thread of this process on `cpus` (`taskset`'s list);
/// whether it could.
fn lab_on(cpus: &str) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// What a round of [`local_pairs`] checks: a limiter, each thread's key,
/// and the quota the checks carry (or the limiter's own).
struct Subject<'a> {
    limiter: &'a tollgate_redis::RedisLimiter,
    keys: [&'static str; 2],
    carried: Option<tollgate::Quota>,
}

/// Interleaved pairs of rounds of `base` and `subject` (each a drained
/// key a thread, every check denied), at one thread and at two; prints a
/// row a thread count: each one's median time per check and the median of
/// the paired ratios with its 95 % interval.
fn local_pairs(pairs: usize, base: Subject<'_>, subject: Subject<'_>) {
    use std::sync::Barrier;
    use std::time::Instant;

    for threads in [1_usize, 2] {
        let round = |subject: &Subject<'_>| {
            let start = Barrier::new(threads);
            let elapsed: Vec<f64> = std::thread::scope(|scope| {
                let handles: Vec<_> = subject.keys[..threads]
                    .iter()
                    .map(|key| {
                        let start = &start;
                        scope.spawn(move || {
                            let runtime = tokio::runtime::Builder::new_current_thread()
                                .build()
                                .expect("a runtime");
                            start.wait();
                            let began = Instant::now();
                            runtime.block_on(async {
                                for _ in 0..LOCAL_CHECKS {
                                    let decision = match &subject.carried {
                                        Some(quota) => {
                                            subject.limiter.check_with(*key, quota).await
                                        }
                                        None => subject.limiter.check(*key).await,
                                    }
                                    .expect("a check");
                                    assert!(!decision.is_allowed(), "drained");
                                }
                            });
                            began.elapsed().as_secs_f64()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|handle| handle.join().expect("a round"))
                    .collect()
            });
            elapsed.iter().copied().fold(0.0, f64::max) * 1e9 / f64::from(LOCAL_CHECKS)
        };
        let (mut based, mut subjected) = (Vec::new(), Vec::new());
        for pair in 0..pairs.max(1) {
            // Alternate which goes first.
            if pair % 2 == 0 {
                based.push(round(&base));
                subjected.push(round(&subject));
            } else {
                subjected.push(round(&subject));
                based.push(round(&base));
            }
        }
        let mut ratios: Vec<f64> = subjected.iter().zip(&based).map(|(s, b)| s / b).collect();
        println!(
            "| {threads} | {:.1} ns | {:.1} ns | **{}** |",
            crate::stats::median(&mut based),
            crate::stats::median(&mut subjected),
            crate::stats::median_ci(&mut ratios).show(3),
        );
    }
    println!();
}
