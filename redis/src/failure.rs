//! What a check returns when Redis cannot answer, and the circuit breaker
//! that makes a dead Redis cost microseconds instead of a timeout a check.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::algorithm::Carry;
use tollgate::clock::TscClock;
use tollgate::store::{ChangeError, Sharded, WhenFull};
use tollgate::{Builder, Decision, Quota, RateLimiter};

use crate::error::{ConfigError, Error};
use crate::script::Scripted;

/// The policy for a check Redis could not decide (unreachable, timed out,
/// refusing the credentials, or behind an open circuit breaker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// Return [`Error::Unavailable`]: the caller chooses (the default).
    #[default]
    Error,
    /// Deny, with `retry_after` the time until the breaker next lets a
    /// check through to Redis (at least one nanosecond). Fails closed: no
    /// over-admission, and no service while Redis is down.
    Deny,
    /// Admit, reporting nothing remaining. Fails open: the service stays
    /// up and is not limited while Redis is down.
    Admit,
    /// Decide with an in-process limiter holding `1 / instances` of the
    /// quota (its limit and burst divided, rounded down), so that
    /// `instances` instances together admit at most the quota while Redis is
    /// down (plus what Redis admitted in the same window before it failed).
    Local {
        /// How many instances share the quota.
        instances: u32,
    },
}

/// Counts consecutive failures; after `threshold` of them, sends no check
/// to Redis for `cooldown`, then lets one probe through (half-open): its
/// success closes the breaker, its failure opens it again. While the probe
/// is out (at most a call timeout) no other check goes through, however
/// short the cooldown.
///
/// Lock-free: a check reads one word when closed; only failures and probes
/// write.
#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    cooldown: Duration,
    /// How long a probe may take: the call timeout.
    probe: Duration,
    failures: AtomicU32,
    /// Nanoseconds since `origin` until which checks skip Redis; 0: closed.
    open_until_ns: AtomicU64,
    origin: Instant,
    /// How many times the breaker opened, and closed again.
    opened: AtomicU64,
    closed: AtomicU64,
}

/// Whether a check may go to Redis.
pub(crate) enum Admission {
    /// Send it.
    Send,
    /// Do not: the breaker is open for this long.
    Skip(Duration),
}

impl Breaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration, probe: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            probe,
            failures: AtomicU32::new(0),
            open_until_ns: AtomicU64::new(0),
            origin: Instant::now(),
            opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn admit(&self) -> Admission {
        // Acquire/Release are not needed for the decision itself (the word is
        // the whole state), but Relaxed suffices: the breaker only chooses
        // whether to send, never what Redis decides.
        let open_until_ns = self.open_until_ns.load(Ordering::Relaxed);
        if open_until_ns == 0 {
            return Admission::Send;
        }
        let now_ns = self.now_ns();
        if now_ns < open_until_ns {
            return Admission::Skip(Duration::from_nanos(open_until_ns - now_ns));
        }
        // Half-open: the one check that moves the deadline on is the probe;
        // the others wait for its outcome (it fails or succeeds within the
        // call timeout) as if the breaker were open.
        let probe_until = now_ns
            .saturating_add(duration_ns(self.cooldown.saturating_add(self.probe)))
            .max(1);
        match self.open_until_ns.compare_exchange(
            open_until_ns,
            probe_until,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => Admission::Send,
            Err(_) => Admission::Skip(Duration::from_nanos(1)),
        }
    }

    /// Returns how long the breaker stays open, if it is, without claiming
    /// a probe.
    pub(crate) fn admit_peek(&self) -> Option<Duration> {
        let open_until_ns = self.open_until_ns.load(Ordering::Relaxed);
        let now_ns = self.now_ns();
        (open_until_ns > now_ns).then(|| Duration::from_nanos(open_until_ns - now_ns))
    }

    pub(crate) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.open_until_ns.load(Ordering::Relaxed) != 0
            && self.open_until_ns.swap(0, Ordering::Relaxed) != 0
        {
            self.closed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the breaker is open (or half-open), and how many times it
    /// opened and closed so far.
    #[cfg(feature = "metrics")]
    pub(crate) fn state(&self) -> (bool, u64, u64) {
        (
            self.open_until_ns.load(Ordering::Relaxed) != 0,
            self.opened.load(Ordering::Relaxed),
            self.closed.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn failed(&self) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if failures >= self.threshold {
            let until = self
                .now_ns()
                .saturating_add(duration_ns(self.cooldown))
                .max(1);
            // Never earlier: a late failure of a call sent before the
            // breaker opened must not cut a probe's hold short.
            if self.open_until_ns.fetch_max(until, Ordering::Relaxed) == 0 {
                self.opened.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The most keys the local fallback tracks; a new key beyond them is
/// denied while Redis is down.
const LOCAL_MAX_KEYS: usize = 100_000;

/// The decision the policy gives in place of Redis's.
pub(crate) struct Fallback<A: Scripted> {
    policy: OnFailure,
    local: Option<RateLimiter<Vec<u8>, A, TscClock, Sharded>>,
}

impl<A: Scripted> Fallback<A> {
    pub(crate) fn new(policy: OnFailure, quota: &Quota) -> Result<Self, ConfigError> {
        let local = match policy {
            OnFailure::Local { instances } => Some(
                Builder::new(share::<A>(instances, quota)?)
                    .algorithm::<A>()
                    .store(Sharded::default())
                    .max_keys(
                        NonZeroUsize::new(LOCAL_MAX_KEYS).expect("nonzero"),
                        WhenFull::Reject,
                    )
                    .build::<Vec<u8>>(),
            ),
            _ => None,
        };
        Ok(Self { policy, local })
    }

    /// Whether the local share can follow the limiter's quota to `quota`:
    /// [`set_quota`](Self::set_quota)'s refusals that depend on `quota`.
    pub(crate) fn accepts(&self, quota: &Quota) -> Result<(), ConfigError> {
        match (&self.local, self.policy) {
            (Some(_), OnFailure::Local { instances }) => share::<A>(instances, quota).map(drop),
            _ => Ok(()),
        }
    }

    /// Changes the local share with the limiter's quota. The share is
    /// carried by the limiter's strategy, or unchanged once checks carrying
    /// their own quotas fell back on it (the in-process limiters allow no
    /// other then).
    pub(crate) fn set_quota(&self, quota: &Quota, carry: Carry) -> Result<(), ConfigError> {
        let (Some(local), OnFailure::Local { instances }) = (&self.local, self.policy) else {
            return Ok(());
        };
        let share = share::<A>(instances, quota)?;
        match local.set_quota(share, carry) {
            Err(ChangeError::CarriedQuotas) => local.set_quota(share, Carry::Unchanged),
            changed => changed,
        }
        .map_err(ConfigError::Change)
    }

    pub(crate) fn policy(&self) -> OnFailure {
        self.policy
    }

    /// Returns the policy's decision for a check (or a `peek`) Redis did
    /// not decide, with the quota that made it, or the error to return.
    /// `open_for` is how long the breaker keeps Redis out of reach (zero
    /// when it is closed).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decide(
        &self,
        key: &[u8],
        cost: u32,
        peek: bool,
        limit: u32,
        carried: Option<&Quota>,
        open_for: Duration,
        cause: Unavailable,
    ) -> Result<Enforced, Error> {
        let wait = open_for.max(Duration::from_nanos(1));
        // Counted by no quota: a decision of the policy's own.
        let uncounted = |decision: Option<Decision>| {
            decision.map(|decision| Enforced {
                decision,
                quota: None,
            })
        };
        let enforced = match (&self.local, self.policy) {
            (Some(local), OnFailure::Local { instances }) => match checked(
                local,
                key,
                cost,
                peek,
                carried.map(|quota| share::<A>(instances, quota)),
            ) {
                Some((decision, quota)) => Some(Enforced {
                    decision,
                    quota: Some(quota),
                }),
                // A new key beyond the local cap, or a cost above the
                // local share's burst: denied until Redis is back.
                None => uncounted(Decision::from_parts(limit, 0, wait, wait)),
            },
            (None, OnFailure::Deny) => uncounted(Decision::from_parts(limit, 0, wait, wait)),
            (None, OnFailure::Admit) => uncounted(Decision::from_parts(
                limit,
                0,
                Duration::ZERO,
                Duration::ZERO,
            )),
            _ => None,
        };
        enforced.ok_or(Error::Unavailable(cause))
    }
}

/// The share of `quota` one of `instances` enforces alone. A window
/// algorithm's share is its burst's share over the quota's burst window
/// in whole microseconds, the window the script counts in, so that it
/// changes with every quota the script takes for that window.
fn share<A: Scripted>(instances: u32, quota: &Quota) -> Result<Quota, ConfigError> {
    let part = |value: u32| value.checked_div(instances).filter(|&v| v > 0);
    let too_small = || ConfigError::ShareTooSmall {
        instances,
        limit: quota.limit(),
        burst: quota.burst(),
    };
    let burst = part(quota.burst()).ok_or_else(too_small)?;
    if A::BY_INTERVAL {
        let limit = part(quota.limit()).ok_or_else(too_small)?;
        Quota::new(limit, quota.window()).and_then(|local| local.with_burst(burst))
    } else {
        let window_us = quota.burst_window().as_nanos().div_ceil(1_000);
        let window = Duration::from_micros(u64::try_from(window_us).unwrap_or(u64::MAX));
        Quota::new(burst, window)
    }
    .map_err(ConfigError::LocalQuota)
}

/// The local share's decision, under the share of the check's own quota
/// (`carried`) if it carries one, with the quota that made it; `None` for
/// any error (a share too small, a key beyond the cap, a cost above the
/// burst), which the caller denies.
fn checked<A: Scripted>(
    local: &RateLimiter<Vec<u8>, A, TscClock, Sharded>,
    key: &[u8],
    cost: u32,
    peek: bool,
    carried: Option<Result<Quota, ConfigError>>,
) -> Option<(Decision, Quota)> {
    let (decision, quota) = match carried {
        // The quota that decided, across a change of the share.
        None if !peek => return local.check_n_quoted(key, cost, None).ok(),
        None => (local.peek(key), local.quota()),
        Some(share) => {
            let share = share.ok()?;
            (
                if peek {
                    local.peek_with(key, &share)
                } else {
                    local.check_n_with(key, cost, &share)
                },
                share,
            )
        }
    };
    Some((decision.ok()?, quota))
}

/// A check's decision, and the quota that made it
/// ([`RedisLimiter::check_n_enforced`](crate::RedisLimiter::check_n_enforced)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enforced {
    /// The decision.
    pub decision: Decision,
    /// The quota that decided it:
    ///
    /// * the limiter's own ([`RedisLimiter::quota`](crate::RedisLimiter::quota))
    ///   when Redis decided, or this instance from what Redis told it (a
    ///   [`Mode`](crate::Mode) other than `Exact`);
    /// * while Redis could not decide, the in-process share
    ///   [`OnFailure::Local`] enforces (its limit and burst divided by the
    ///   instances);
    /// * `None` when no quota counted the check: [`OnFailure::Deny`] and
    ///   [`OnFailure::Admit`] decide without counting, and so does
    ///   [`OnFailure::Local`] for a check its share cannot take (a new key
    ///   beyond its keys, a cost above its burst), denied until Redis is
    ///   back.
    pub quota: Option<Quota>,
}

/// Why Redis did not decide a check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// The call failed: connection refused or reset, authentication
    /// refused, or an error reply.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// No reply within the per-call timeout. The script may still have run
    /// (the notes argue what that means for counting).
    #[error("no reply within {0:?}")]
    Timeout(Duration),
    /// The circuit breaker is open after repeated failures: no call was
    /// made.
    #[error("circuit breaker open for another {0:?}")]
    BreakerOpen(Duration),
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::time::Duration;

    use super::{Admission, Breaker};

    #[test]
    fn a_half_open_breaker_lets_exactly_one_probe_through() {
        let breaker = Breaker::new(2, Duration::from_millis(20), Duration::from_secs(30));
        breaker.failed();
        assert!(
            matches!(breaker.admit(), Admission::Send),
            "one failure of two"
        );
        breaker.failed();
        assert!(matches!(breaker.admit(), Admission::Skip(_)), "open");
        std::thread::sleep(Duration::from_millis(30));
        // Cooled down: of eight concurrent checks, one probes; the others
        // wait for its outcome, however long the cooldown has been over.
        let barrier = Barrier::new(8);
        let probes = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        barrier.wait();
                        matches!(breaker.admit(), Admission::Send)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| usize::from(handle.join().expect("no panic")))
                .sum::<usize>()
        });
        assert_eq!(probes, 1);
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            matches!(breaker.admit(), Admission::Skip(_)),
            "the probe is still out"
        );
        breaker.succeeded();
        assert!(matches!(breaker.admit(), Admission::Send), "closed");
    }
}
