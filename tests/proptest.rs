//! Property tests: random sequences of (advance time, key, cost) checked
//! against naive sequential reference models, and against the rate oracles
//! each algorithm promises, on the lock-free and global-mutex stores.
//! Failing cases are kept in `tests/proptest.proptest-regressions` and rerun
//! first.

// Ordinary tests use std's primitives; under the model-checking features the
// crate's primitives are loom's or shuttle's, usable only inside a model.
#![cfg(not(any(feature = "loom", feature = "shuttle")))]

#[path = "support/builders.rs"]
mod builders;

use std::collections::HashMap;

use proptest::prelude::*;
use tollgate::Quota;
use tollgate::algorithm::{
    Algorithm, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::clock::ManualClock;
use tollgate::store::{GlobalMutex, LockFree, StoreKind};

use builders::limiter;

/// One request: move the clock by `advance_ns` (backwards when `back`),
/// then check `cost` units on `key`.
#[derive(Debug, Clone, Copy)]
struct Step {
    advance_ns: u64,
    back: bool,
    key: u64,
    cost: u32,
}

/// Quotas with small bursts and windows that do not divide evenly.
fn quotas() -> impl Strategy<Value = Quota> {
    (1_u32..=6, 1_u64..=5_000_000_000, 1_u32..=8).prop_map(|(limit, window_ns, burst)| {
        Quota::new(
            limit,
            std::time::Duration::from_nanos(window_ns.max(u64::from(limit))),
        )
        .unwrap()
        .with_burst(burst)
        .unwrap()
    })
}

/// Forward-only steps: gaps from nothing to a few windows.
fn forward_steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0_u64..3_000_000_000, 0_u64..3, 1_u32..=4).prop_map(|(advance_ns, key, cost)| Step {
            advance_ns: advance_ns % 4 * (advance_ns / 4 % 750_000_000),
            back: false,
            key,
            cost,
        }),
        1..150,
    )
}

/// Steps whose clock sometimes reads backwards.
fn wandering_steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0_u64..2_000_000_000,
            prop::bool::weighted(0.25),
            0_u64..2,
            1_u32..=3,
        )
            .prop_map(|(advance_ns, back, key, cost)| Step {
                advance_ns,
                back,
                key,
                cost,
            }),
        1..150,
    )
}

/// Runs `steps` on a limiter; returns (reading, key, cost, admitted) per
/// step. An invalid cost (above the burst) must be an error, never a denial.
fn run<A: Algorithm, S: StoreKind<u64, A>>(
    quota: Quota,
    store: S,
    steps: &[Step],
) -> Vec<(u64, u64, u32, bool)> {
    let clock = ManualClock::new();
    let limiter = limiter::<A, S>(quota, store, &clock);
    let mut now_ns = 10_000_000_000_u64;
    clock.set_ns(now_ns);
    steps
        .iter()
        .map(|step| {
            now_ns = if step.back {
                now_ns.saturating_sub(step.advance_ns)
            } else {
                now_ns + step.advance_ns
            };
            clock.set_ns(now_ns);
            let admitted = match limiter.check_n(&step.key, step.cost) {
                Ok(decision) => decision.is_allowed(),
                Err(error) => {
                    assert!(step.cost > quota.burst(), "{error} for cost {}", step.cost);
                    false
                }
            };
            (now_ns, step.key, step.cost, admitted)
        })
        .collect()
}

// --- Naive sequential reference models -------------------------------------

/// A reference: decides one request on one key, with monotone time.
trait Reference {
    fn admit(&mut self, key: u64, now_ns: u64, cost: u32) -> bool;
}

/// Token bucket with exact rational tokens: `credit` counts nanoseconds of
/// refill, capped at `burst` intervals. GCRA must decide identically.
struct BucketReference {
    interval_ns: u128,
    burst: u128,
    keys: HashMap<u64, (u128, u64)>,
}

impl Reference for BucketReference {
    fn admit(&mut self, key: u64, now_ns: u64, cost: u32) -> bool {
        let full = self.burst * self.interval_ns;
        let (credit, last) = self.keys.get(&key).copied().unwrap_or((full, now_ns));
        let credit = (credit + u128::from(now_ns - last)).min(full);
        let need = u128::from(cost) * self.interval_ns;
        let admitted = credit >= need;
        self.keys
            .insert(key, (if admitted { credit - need } else { credit }, now_ns));
        admitted
    }
}

/// Fixed window: a count per (key, window index).
struct FixedReference {
    window_ns: u64,
    burst: u32,
    counts: HashMap<(u64, u64), u32>,
}

impl Reference for FixedReference {
    fn admit(&mut self, key: u64, now_ns: u64, cost: u32) -> bool {
        let count = self
            .counts
            .entry((key, now_ns / self.window_ns))
            .or_default();
        let admitted = *count + cost <= self.burst;
        if admitted {
            *count += cost;
        }
        admitted
    }
}

/// Sliding log: every admission ever, counted in the trailing window.
struct LogReference {
    window_ns: u64,
    burst: u32,
    admissions: Vec<(u64, u64, u32)>,
}

impl Reference for LogReference {
    fn admit(&mut self, key: u64, now_ns: u64, cost: u32) -> bool {
        let in_window: u32 = self
            .admissions
            .iter()
            .filter(|&&(k, at, _)| k == key && at + self.window_ns > now_ns)
            .map(|&(_, _, cost)| cost)
            .sum();
        let admitted = in_window + cost <= self.burst;
        if admitted {
            self.admissions.push((key, now_ns, cost));
        }
        admitted
    }
}

/// Sliding counter: counts per (key, window), the estimate compared exactly
/// in integers scaled by the window.
struct CounterReference {
    window_ns: u64,
    burst: u32,
    counts: HashMap<(u64, u64), u32>,
}

impl Reference for CounterReference {
    fn admit(&mut self, key: u64, now_ns: u64, cost: u32) -> bool {
        let index = now_ns / self.window_ns;
        let elapsed = u128::from(now_ns % self.window_ns);
        let window = u128::from(self.window_ns);
        let previous = index
            .checked_sub(1)
            .and_then(|previous| self.counts.get(&(key, previous)).copied())
            .unwrap_or(0);
        let current = self.counts.get(&(key, index)).copied().unwrap_or(0);
        let admitted = u128::from(previous) * (window - elapsed)
            + u128::from(current + cost) * window
            <= u128::from(self.burst) * window;
        if admitted {
            *self.counts.entry((key, index)).or_default() += cost;
        }
        admitted
    }
}

fn interval_ns(quota: &Quota) -> u64 {
    u64::try_from(quota.emission_interval().as_nanos()).unwrap()
}

fn burst_window_ns(quota: &Quota) -> u64 {
    u64::try_from(quota.burst_window().as_nanos()).unwrap()
}

/// Every decision of algorithm `A` on `store` equals the reference's.
fn matches_reference<A: Algorithm, S: StoreKind<u64, A>>(
    quota: Quota,
    store: S,
    steps: &[Step],
    mut reference: impl Reference,
) -> Result<(), TestCaseError> {
    for (index, &(now_ns, key, cost, admitted)) in
        run::<A, S>(quota, store, steps).iter().enumerate()
    {
        let expected = cost <= quota.burst() && reference.admit(key, now_ns, cost);
        prop_assert_eq!(
            admitted,
            expected,
            "step {} at {} ns: key {} cost {}",
            index,
            now_ns,
            key,
            cost
        );
    }
    Ok(())
}

fn bucket(quota: &Quota) -> BucketReference {
    BucketReference {
        interval_ns: u128::from(interval_ns(quota)),
        burst: u128::from(quota.burst()),
        keys: HashMap::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn token_bucket_matches_its_reference(quota in quotas(), steps in forward_steps()) {
        matches_reference::<TokenBucket, _>(quota, LockFree::default(), &steps, bucket(&quota))?;
        matches_reference::<TokenBucket, _>(quota, GlobalMutex, &steps, bucket(&quota))?;
    }

    #[test]
    fn gcra_matches_the_token_bucket_reference(quota in quotas(), steps in forward_steps()) {
        matches_reference::<Gcra, _>(quota, LockFree::default(), &steps, bucket(&quota))?;
        matches_reference::<Gcra, _>(quota, GlobalMutex, &steps, bucket(&quota))?;
    }

    #[test]
    fn fixed_window_matches_its_reference(quota in quotas(), steps in forward_steps()) {
        let reference = || FixedReference {
            window_ns: burst_window_ns(&quota), burst: quota.burst(), counts: HashMap::new(),
        };
        matches_reference::<FixedWindow, _>(quota, LockFree::default(), &steps, reference())?;
        matches_reference::<FixedWindow, _>(quota, GlobalMutex, &steps, reference())?;
    }

    #[test]
    fn sliding_log_matches_its_reference(quota in quotas(), steps in forward_steps()) {
        let reference = || LogReference {
            window_ns: burst_window_ns(&quota), burst: quota.burst(), admissions: Vec::new(),
        };
        matches_reference::<SlidingWindowLog, _>(quota, LockFree::default(), &steps, reference())?;
        matches_reference::<SlidingWindowLog, _>(quota, GlobalMutex, &steps, reference())?;
    }

    #[test]
    fn sliding_counter_matches_its_reference(quota in quotas(), steps in forward_steps()) {
        let reference = || CounterReference {
            window_ns: burst_window_ns(&quota), burst: quota.burst(), counts: HashMap::new(),
        };
        matches_reference::<SlidingWindowCounter, _>(quota, LockFree::default(), &steps, reference())?;
        matches_reference::<SlidingWindowCounter, _>(quota, GlobalMutex, &steps, reference())?;
    }

    /// The GCRA and token-bucket rate oracle, with readings that go
    /// backwards: on the key's own time line (`latest_seen`), the cost
    /// admitted over any span [t_i, t_j] is at most
    /// burst + (t_j − t_i) / interval. A reading older than the key's state
    /// never buys extra room.
    #[test]
    fn bucket_algorithms_never_exceed_burst_plus_rate(quota in quotas(), steps in wandering_steps()) {
        for outcomes in [
            run::<Gcra, _>(quota, LockFree::default(), &steps),
            run::<TokenBucket, _>(quota, GlobalMutex, &steps),
        ] {
            let interval = u128::from(interval_ns(&quota));
            for key in 0..2 {
                let admitted = latest_seen(&outcomes, key);
                for (i, &(start, _)) in admitted.iter().enumerate() {
                    let mut cost = 0_u128;
                    for &(end, unit_cost) in &admitted[i..] {
                        cost += u128::from(unit_cost);
                        let allowance = u128::from(quota.burst()) * interval + u128::from(end - start);
                        prop_assert!(cost * interval <= allowance,
                            "key {}: {} units in [{}, {}] ns", key, cost, start, end);
                    }
                }
            }
        }
    }

    /// The sliding log's oracle, with readings that go backwards: over any
    /// window-long span of the key's own time line, at most the burst.
    #[test]
    fn sliding_log_never_exceeds_the_burst_in_any_window(quota in quotas(), steps in wandering_steps()) {
        let window = burst_window_ns(&quota);
        let outcomes = run::<SlidingWindowLog, _>(quota, LockFree::default(), &steps);
        for key in 0..2 {
            let admitted = latest_seen(&outcomes, key);
            for &(end, _) in &admitted {
                let in_window: u32 = admitted
                    .iter()
                    .filter(|&&(at, _)| at <= end && at + window > end)
                    .map(|&(_, cost)| cost)
                    .sum();
                prop_assert!(in_window <= quota.burst(),
                    "key {}: {} units in the window ending {} ns", key, in_window, end);
            }
        }
    }
}

/// The admissions of `key` as (effective time, cost): the running maximum of
/// the readings at which that key was admitted. That is the key's own time
/// line, the one the contract is about ("a reading older than the key's
/// state"). Measuring every key on the latest reading of *any* key would be
/// wrong: after the clock jumped back, a key with no state is admitted at
/// two readings 1 ns apart, correctly, and that timeline would put both at
/// the same instant (a case `tests/proptest.proptest-regressions` keeps).
fn latest_seen(outcomes: &[(u64, u64, u32, bool)], key: u64) -> Vec<(u64, u32)> {
    let mut latest = 0;
    outcomes
        .iter()
        .filter(|&&(_, k, _, admitted)| k == key && admitted)
        .map(|&(now_ns, _, cost, _)| {
            latest = latest.max(now_ns);
            (latest, cost)
        })
        .collect()
}

// --- Refunds -----------------------------------------------------------------

/// One request on one key: move the clock forward by `advance_ns`, then
/// check `cost` units keeping the receipt, or, for `refund`, give back the
/// admission of an outstanding receipt (the `cost`-th, counted round the
/// list). Forward only: what a refund promises is on the key's time line
/// as the clock moves forward (see note 11 for a clock that steps back).
#[derive(Debug, Clone, Copy)]
struct RefundStep {
    advance_ns: u64,
    refund: bool,
    cost: u32,
}

fn refund_steps() -> impl Strategy<Value = Vec<RefundStep>> {
    prop::collection::vec(
        (0_u64..2_000_000_000, prop::bool::weighted(0.4), 1_u32..=3).prop_map(
            |(advance_ns, refund, cost)| RefundStep {
                // Many steps at the same instant, where refunds race most.
                advance_ns: advance_ns % 3 * (advance_ns / 3 % 700_000_000),
                refund,
                cost,
            },
        ),
        1..150,
    )
}

/// Runs `steps` with refunds, then replays the admissions that stayed
/// charged (all but those a refund gave back in full or in part) on a
/// fresh limiter at the same readings: it must admit every one. That is
/// what "a refund never admits more than the quota" means: what the key
/// kept is a schedule the quota allows.
fn refunds_keep_a_feasible_schedule<A: Algorithm, S: StoreKind<u64, A>>(
    quota: Quota,
    store: S,
    steps: &[RefundStep],
) -> Result<(), TestCaseError> {
    use tollgate::algorithm::Refund;

    let clock = ManualClock::new();
    let subject = limiter::<A, S>(quota, store, &clock);
    let mut now_ns = 10_000_000_000_u64;
    // (reading, cost, given back)
    let mut admissions: Vec<(u64, u32, bool)> = Vec::new();
    let mut outstanding: Vec<(usize, tollgate::algorithm::Receipt)> = Vec::new();
    clock.set_ns(now_ns);
    for step in steps {
        now_ns += step.advance_ns;
        clock.set_ns(now_ns);
        if step.refund {
            if outstanding.is_empty() {
                continue;
            }
            let (index, receipt) = outstanding.swap_remove(step.cost as usize % outstanding.len());
            match subject.refund(&1, receipt) {
                Refund::Full | Refund::Partial => admissions[index].2 = true,
                Refund::Nothing => {}
            }
        } else if step.cost <= quota.burst() {
            let (decision, receipt) = subject.check_n_receipt(&1, step.cost).unwrap();
            if decision.is_allowed() {
                outstanding.push((admissions.len(), receipt.unwrap()));
                admissions.push((now_ns, step.cost, false));
            }
        }
    }
    let replay_clock = ManualClock::new();
    let replay = limiter::<A, _>(quota, GlobalMutex, &replay_clock);
    for &(at_ns, cost, given_back) in &admissions {
        if given_back {
            continue;
        }
        replay_clock.set_ns(at_ns);
        let decision = replay.check_n(&1, cost).unwrap();
        prop_assert!(
            decision.is_allowed(),
            "{}: kept {} units at {} ns: {:?} in {:?}",
            std::any::type_name::<A>(),
            cost,
            at_ns,
            decision,
            admissions
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn refunds_never_admit_more_than_the_quota(quota in quotas(), steps in refund_steps()) {
        refunds_keep_a_feasible_schedule::<Gcra, _>(quota, LockFree::default(), &steps)?;
        refunds_keep_a_feasible_schedule::<TokenBucket, _>(quota, GlobalMutex, &steps)?;
        refunds_keep_a_feasible_schedule::<FixedWindow, _>(quota, LockFree::default(), &steps)?;
        refunds_keep_a_feasible_schedule::<SlidingWindowCounter, _>(quota, LockFree::default(), &steps)?;
        refunds_keep_a_feasible_schedule::<SlidingWindowLog, _>(quota, GlobalMutex, &steps)?;
    }
}
