//! The script against the in-process pure functions, on a real Redis.
//!
//! Random quotas (intervals and windows in nanoseconds, most of them not
//! whole microseconds) and random traces of (time step, key, cost, peek),
//! with steps backwards as well as forwards, run through the Redis limiter
//! with a client clock on microsecond instants (the trace's time plus the
//! real time elapsed, so that a key's expiry on the server's clock is part
//! of what is compared; the limiter's expiry grace covers the trace's
//! steps back and a second of delay, as `Builder::expiry_grace` asks of a
//! clock that can read behind an earlier write's reading), and through the
//! in-process
//! limiter of the same algorithm whose quota is the Redis one's: interval or
//! window rounded up to the microsecond, computed here independently of the
//! crate. Every step's result (decision or error) must be equal, once the
//! in-process waits are put on the microsecond grid the script decides on
//! (rounded up: the first whole microsecond at which the in-process limiter
//! admits).
//!
//! GCRA runs in two places in the script: a path for one limit (checks and
//! peeks) and the loop that decides several limits together. Its checks
//! are compared twice: alone, and together with a second limit that always
//! admits ([`Path::Together`]), so that the loop decides them.
//!
//! Planted bugs in copies of the script (a timestamp through `tostring`,
//! truncation where the arithmetic rounds up, a float division where it
//! divides exactly) must each make the comparison fail.

mod support {
    #[allow(dead_code)]
    pub mod redis;
    #[allow(dead_code)]
    pub mod target;
}

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use tollgate::algorithm::{
    Algorithm, Carry, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::cell::{CellFor, Preferred};
use tollgate::clock::ManualClock;
use tollgate::{Builder, Decision, Quota};
use tollgate_redis::{RedisLimiter, SCRIPT, Scripted, check_all};

use support::target::{Kind, Target};

/// A Unix instant in 2026, in µs: times of the size the server's clock
/// gives, far above 2^32 and with 16 digits, so that a timestamp through a
/// float format loses digits.
const START_US: u64 = 1_764_831_234_567_891;

#[derive(Debug, Clone)]
struct Case {
    limit: u32,
    window_ns: u64,
    burst: u32,
    steps: Vec<Step>,
    changes: Vec<Change>,
}

/// A quota change before one step (a case has up to two): the new limit,
/// window (the interval algorithms only: the window algorithms keep
/// theirs) and burst, and the strategy. Every key is checked once at the
/// change's instant, so that the script carries each then, as the
/// in-process limiter does; a second change then carries each key from
/// the quota the first left it under.
#[derive(Debug, Clone, Copy)]
struct Change {
    at: prop::sample::Index,
    limit: u32,
    window_ns: u64,
    burst: u32,
    carry: Carry,
}

#[derive(Debug, Clone, Copy)]
struct Step {
    /// Microseconds to move the clock, in thousandths of the quota's span
    /// (negative: backwards).
    per_mille: i64,
    key: u8,
    cost: u32,
    peek: bool,
}

fn cases() -> impl Strategy<Value = Case> {
    (1_u32..=12, 1_000_u64..=3_000_000_000, 1_u32..=16).prop_flat_map(
        |(limit, window_ns, burst)| {
            let step = (
                -300_i64..=2_500,
                0_u8..3,
                0_u32..=burst + 1,
                proptest::bool::weighted(0.1),
            )
                .prop_map(|(per_mille, key, cost, peek)| Step {
                    // Mostly small steps, so that keys are often drained.
                    per_mille: if per_mille > 600 {
                        per_mille / 8
                    } else {
                        per_mille
                    },
                    key,
                    cost,
                    peek,
                });
            let change = (
                any::<prop::sample::Index>(),
                1_u32..=12,
                1_000_u64..=3_000_000_000,
                1_u32..=16,
                prop_oneof![
                    Just(Carry::AsIs),
                    Just(Carry::Proportional),
                    Just(Carry::Unchanged)
                ],
            )
                .prop_map(|(at, limit, window_ns, burst, carry)| Change {
                    at,
                    limit,
                    window_ns,
                    burst,
                    carry,
                });
            (
                proptest::collection::vec(step, 1..120),
                proptest::collection::vec(change, 0..=2),
            )
                .prop_map(move |(steps, changes)| Case {
                    limit,
                    window_ns,
                    burst,
                    steps,
                    changes,
                })
        },
    )
}

/// The quota the script enforces, built without the crate: the interval
/// (GCRA, token bucket) or the burst window (the window algorithms) rounded
/// up to a whole microsecond.
fn micro_quota<A: Scripted>(quota: &Quota) -> Option<Quota> {
    let by_interval = A::BY_INTERVAL;
    let span = if by_interval {
        quota.emission_interval()
    } else {
        quota.burst_window()
    };
    let span = Duration::from_micros(u64::try_from(span.as_nanos().div_ceil(1_000)).ok()?);
    if by_interval {
        Quota::new(1, span).ok()?.with_burst(quota.burst()).ok()
    } else {
        Quota::new(quota.burst(), span).ok()
    }
}

/// How the Redis limiter's checks are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// One limit a call (`check_n`).
    Alone,
    /// With a second limit in the same call (`check_all`), which admits
    /// every check of a trace (a million units a million seconds), so that
    /// the call's outcome is the limit's own. Peeks stay alone.
    Together,
}

fn differential<A: Scripted>(
    target: &Target,
    script: Option<&str>,
    path: Path,
    case: &Case,
) -> Result<(), TestCaseError>
where
    Preferred: CellFor<A>,
{
    let Ok(quota) = Quota::new(case.limit, Duration::from_nanos(case.window_ns))
        .and_then(|quota| quota.with_burst(case.burst))
    else {
        return Ok(());
    };
    let reference_quota = micro_quota::<A>(&quota).expect("a quota of whole microseconds");
    let span_us = if A::BY_INTERVAL {
        reference_quota.emission_interval()
    } else {
        reference_quota.burst_window()
    }
    .as_micros() as i64
        * i64::from(quota.burst());
    let clock = ManualClock::new();
    let reference = Builder::new(reference_quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .build::<u8>();
    // The trace's time: each step's, and how far it ever falls behind an
    // earlier one. A key expires on the server's clock, by a reading the
    // trace can later step back from; a grace that long, plus a second for
    // a loaded host's delay between a reading and the script, keeps every
    // key until the trace's clock sees it fresh (`Builder::expiry_grace`).
    let trace: Vec<i64> = case
        .steps
        .iter()
        .scan(START_US as i64, |trace_us, step| {
            *trace_us =
                (*trace_us + step.per_mille * span_us / 1_000).max(START_US as i64 - 10 * span_us);
            Some(*trace_us)
        })
        .collect();
    let behind_us = trace
        .iter()
        .scan(i64::MIN, |highest, &trace_us| {
            *highest = (*highest).max(trace_us);
            Some(*highest - trace_us)
        })
        .max()
        .unwrap_or(0);
    let grace = Duration::from_micros(behind_us as u64) + Duration::from_secs(1);
    let mut builder = RedisLimiter::builder(format!("d{}", unique()), quota)
        .algorithm::<A>()
        .clock(clock.clone())
        .expiry_grace(grace);
    let mut companion = RedisLimiter::builder(
        format!("c{}", unique()),
        Quota::new(1_000_000, Duration::from_secs(1_000_000)).expect("a quota"),
    )
    .clock(clock.clone());
    if path == Path::Together {
        builder = builder.hash_tag("together");
        companion = companion.hash_tag("together");
    }
    if let Some(script) = script {
        builder = builder.script_source(script);
        companion = companion.script_source(script);
    }
    let companion = companion
        .build(target.connection.clone())
        .expect("the companion limiter");
    let limiter = match builder.build(target.connection.clone()) {
        Ok(limiter) => limiter,
        // The log keeps at most one unit a microsecond of its window: a
        // denser quota is refused, and nothing is left to compare.
        Err(tollgate_redis::ConfigError::QuotaTooLarge { value, limit, .. })
            if A::CODE == "l"
                && value == u64::from(quota.burst())
                && limit == reference_quota.burst_window().as_micros() as u64
                && value > limit =>
        {
            return Ok(());
        }
        Err(error) => return Err(TestCaseError::fail(format!("{error}"))),
    };
    // The clock is the trace's time plus the real time elapsed since the
    // case began: keys expire on the server's clock, and a client clock
    // that stood still while real time passed would see them vanish before
    // they would be fresh on it (Builder::clock). Both limiters read
    // the same instant at every step.
    let began = Instant::now();
    let mut carried_once = false;
    for (index, (step, trace_us)) in case.steps.iter().zip(trace).enumerate() {
        let now_us = trace_us + began.elapsed().as_micros() as i64;
        clock.set_ns(now_us as u64 * 1_000);
        for change in case
            .changes
            .iter()
            .filter(|change| change.at.index(case.steps.len()) == index)
        {
            if !changed(&limiter, &reference, &quota, change)? {
                return Ok(());
            }
            // GCRA and the token bucket: a carried debt is in nanoseconds
            // in process (free time × I' / I, rounded toward units used)
            // and in whole microseconds in the script (the same, rounded
            // up to the microsecond), which decide alike on the
            // microsecond grid. Carried again, the in-process debt starts
            // off that grid, and the script's rounding can be a
            // microsecond or more the more conservative: a second change
            // is compared one way (never more permissive), and ends the
            // case. The window algorithms count whole units: exact.
            if A::BY_INTERVAL && carried_once {
                for key in 0..3_u8 {
                    let expected = on_microsecond_grid(reference.peek(&key).expect("a peek"));
                    let actual = target
                        .runtime
                        .block_on(limiter.peek([key]))
                        .map_err(|error| TestCaseError::fail(format!("{error}")))?;
                    prop_assert!(
                        actual.remaining() <= expected.remaining()
                            && actual.retry_after() >= expected.retry_after()
                            && (!actual.is_allowed() || expected.is_allowed()),
                        "key {} after a second change {:?}: {:?} against {:?}",
                        key,
                        change,
                        actual,
                        expected
                    );
                }
                return Ok(());
            }
            carried_once = true;
            // Each key peeked at the change's instant (the script carries
            // it without writing), then checked (the script carries it
            // now, as the in-process limiter carried every key).
            for key in 0..3_u8 {
                let expected = reference.peek(&key).map(on_microsecond_grid);
                let actual = match target.runtime.block_on(limiter.peek([key])) {
                    Ok(decision) => Ok(decision),
                    Err(tollgate_redis::Error::Check(error)) => Err(error),
                    Err(error) => {
                        return Err(TestCaseError::fail(format!(
                            "a peek after the change: {error}"
                        )));
                    }
                };
                prop_assert_eq!(
                    actual,
                    expected,
                    "key {} peeked at the change {:?}",
                    key,
                    change
                );
            }
            for key in 0..3_u8 {
                let expected = reference.check(&key).map(on_microsecond_grid);
                let actual = match target.runtime.block_on(limiter.check([key])) {
                    Ok(decision) => Ok(decision),
                    Err(tollgate_redis::Error::Check(error)) => Err(error),
                    Err(error) => {
                        return Err(TestCaseError::fail(format!("after the change: {error}")));
                    }
                };
                prop_assert_eq!(actual, expected, "key {} at the change {:?}", key, change);
            }
        }
        let key = [step.key];
        let (expected, actual) = if step.peek {
            (
                reference.peek(&step.key),
                target.runtime.block_on(limiter.peek(key)),
            )
        } else {
            let actual = match path {
                Path::Alone => target.runtime.block_on(limiter.check_n(key, step.cost)),
                Path::Together => target
                    .runtime
                    .block_on(check_all(&[
                        limiter.request(key, step.cost),
                        companion.request(key, 1),
                    ]))
                    .map(|decisions| {
                        assert!(
                            decisions.decisions()[1].is_allowed(),
                            "the companion admits"
                        );
                        decisions.decisions()[0]
                    }),
            };
            (reference.check_n(&step.key, step.cost), actual)
        };
        let actual = match actual {
            Ok(decision) => Ok(decision),
            Err(tollgate_redis::Error::Check(error)) => Err(error),
            Err(error) => return Err(TestCaseError::fail(format!("step {index}: {error}"))),
        };
        // Decisions are taken at whole microseconds: an in-process wait
        // that ends between two (the sliding window counter's can) is
        // served at the next one.
        let expected = expected.map(on_microsecond_grid);
        prop_assert_eq!(
            actual,
            expected,
            "step {} of {:?} at {} µs",
            index,
            step,
            now_us
        );
    }
    Ok(())
}

/// Changes both limiters' quotas as `change` says; `false` when the new
/// quota is not one both can hold (nothing then to compare).
fn changed<A: Scripted>(
    limiter: &RedisLimiter<A>,
    reference: &tollgate::RateLimiter<u8, A, ManualClock>,
    quota: &Quota,
    change: &Change,
) -> Result<bool, TestCaseError>
where
    Preferred: CellFor<A>,
{
    // The window algorithms keep their window: a new burst in the same
    // one.
    let new = if A::BY_INTERVAL {
        Quota::new(change.limit, Duration::from_nanos(change.window_ns))
            .and_then(|new| new.with_burst(change.burst))
    } else {
        Quota::new(change.burst, quota.burst_window())
    };
    let Ok(new) = new else {
        return Ok(false);
    };
    let micro = micro_quota::<A>(&new).expect("a quota of whole microseconds");
    if reference.set_quota(micro, change.carry).is_err() {
        return Ok(false);
    }
    match limiter.set_quota(new, change.carry) {
        Ok(()) => Ok(true),
        // Too dense a log for the script (as when building).
        Err(tollgate_redis::ConfigError::QuotaTooLarge { .. }) if A::CODE == "l" => Ok(false),
        Err(error) => Err(TestCaseError::fail(format!("{change:?}: {error}"))),
    }
}

/// The decision with its waits rounded up to whole microseconds.
fn on_microsecond_grid(decision: Decision) -> Decision {
    let up = |wait: Duration| Duration::from_micros(wait.as_nanos().div_ceil(1_000) as u64);
    Decision::from_parts(
        decision.limit(),
        decision.remaining(),
        up(decision.retry_after()),
        up(decision.reset_after()),
    )
    .expect("rounding both waits up keeps their order")
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 128,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/differential.proptest-regressions"
        )))),
        ..ProptestConfig::default()
    }
}

macro_rules! differential_tests {
    ($($name:ident: $algorithm:ty,)*) => {
        std::thread_local! {
            static TARGET: Target = Target::start(Kind::Standalone);
        }
        proptest! {
            #![proptest_config(config())]
            $(
                #[test]
                fn $name(case in cases()) {
                    TARGET.with(|target| differential::<$algorithm>(target, None, Path::Alone, &case))?;
                }
            )*

            #[test]
            fn gcra_checked_together_decides_as_in_process(case in cases()) {
                TARGET.with(|target| differential::<Gcra>(target, None, Path::Together, &case))?;
            }
        }
    };
}

differential_tests! {
    gcra_decides_as_in_process: Gcra,
    token_bucket_decides_as_in_process: TokenBucket,
    fixed_window_decides_as_in_process: FixedWindow,
    sliding_window_counter_decides_as_in_process: SlidingWindowCounter,
    sliding_window_log_decides_as_in_process: SlidingWindowLog,
}

/// The script with `from` replaced by `to` at exactly one place.
fn planted(from: &str, to: &str) -> String {
    assert_eq!(
        SCRIPT.matches(from).count(),
        1,
        "the canary's site moved: {from}"
    );
    SCRIPT.replacen(from, to, 1)
}

/// Runs the differential test with a planted bug: it must fail.
fn assert_caught<A: Algorithm + Scripted>(script: &str, path: Path, bug: &str)
where
    Preferred: CellFor<A>,
{
    let target = Target::start(Kind::Standalone);
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&cases(), |case| {
        differential::<A>(&target, Some(script), path, &case)
    });
    match result {
        Err(proptest::test_runner::TestError::Fail(why, case)) => {
            eprintln!(
                "{bug} ({path:?}) caught: {why} ({} steps)",
                case.steps.len()
            );
        }
        other => panic!("the differential test missed {bug}: {other:?}"),
    }
}

#[test]
fn canary_a_timestamp_through_tostring_is_caught() {
    // GCRA's two copies: one limit alone, and the loop of several.
    let alone = planted(
        "string.format(\"%d \", now + debt)",
        "tostring(now + debt) .. \" \"",
    );
    assert_caught::<Gcra>(&alone, Path::Alone, "tostring");
    let together = planted(
        "{ \"SET\", key, format(\"%d \", now + debt)",
        "{ \"SET\", key, tostring(now + debt) .. \" \"",
    );
    assert_caught::<Gcra>(&together, Path::Together, "tostring");
    let bucket = planted(
        "format(\"%d %d \", debt, last_at) .. key_stamp",
        "tostring(debt) .. \" \" .. tostring(last_at) .. \" \" .. key_stamp",
    );
    assert_caught::<TokenBucket>(&bucket, Path::Alone, "tostring");
    let log = planted(
        "format(\"%d %d %d\", stamp_at, cost, top + cost)",
        "tostring(stamp_at) .. \" \" .. cost .. \" \" .. tostring(top + cost)",
    );
    assert_caught::<SlidingWindowLog>(&log, Path::Alone, "tostring");
}

#[test]
fn canary_truncation_where_the_wait_rounds_up_is_caught() {
    let script = planted(
        "return floor((window * (count - room) + count - 1) / count)",
        "return floor(window * (count - room) / count)",
    );
    assert_caught::<SlidingWindowCounter>(&script, Path::Alone, "truncation for ceiling");
}

#[test]
fn canary_a_float_division_is_caught() {
    let script = planted(
        "local stored_index, count = state[1] or 0, state[2] or 0\n    local index = floor(now / window)",
        "local stored_index, count = state[1] or 0, state[2] or 0\n    local index = now / window",
    );
    assert_caught::<FixedWindow>(&script, Path::Alone, "float division");
}

#[test]
fn canary_a_key_never_carried_is_caught() {
    // The loop's stamps never carry: every key is read as it stands.
    let loop_skips = planted(
        "elseif stored_revision < revision and (span ~= a or burst ~= b) then",
        "elseif false then",
    );
    assert_caught::<FixedWindow>(&loop_skips, Path::Alone, "a skipped carry");
    // One GCRA limit's path decides a stale key itself, uncarried.
    let fast_skips = planted(
        "elseif stored_revision < revision and quota ~= ARGV[5]",
        "elseif false and quota ~= ARGV[5]",
    );
    assert_caught::<Gcra>(
        &fast_skips,
        Path::Alone,
        "a skipped carry on one limit's path",
    );
}

#[test]
fn canary_a_carry_rounded_toward_units_free_is_caught() {
    // In proportion, the debt carried rounded down, not up.
    let script = planted(
        "      if remainder > 0 then\n        carried = quotient + 1\n      end\n    end\n    return carried + booked",
        "    end\n    return carried + booked",
    );
    assert_caught::<TokenBucket>(&script, Path::Alone, "a carry rounded down");
}
