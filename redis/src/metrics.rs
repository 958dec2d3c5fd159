//! A Redis limiter's counts for the `metrics` crate's facade (feature
//! `metrics`). The names and what is counted are documented on
//! [`RedisLimiter::publish_metrics`](crate::RedisLimiter::publish_metrics).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use metrics::{SharedString, counter, gauge, histogram};
use tollgate::metrics::Counts;
use tollgate::{CheckError, Decision};

use crate::connection::CallError;
use crate::failure::{Breaker, Unavailable};

/// The error kinds, in the order of `Metrics::errors`.
const KINDS: [&str; 4] = ["timeout", "connection", "script", "breaker_open"];

/// One limiter's counts.
pub(crate) struct Metrics {
    name: SharedString,
    checks: Counts,
    errors: [AtomicU64; 4],
    fallbacks: AtomicU64,
    /// What the recorder was last handed: local decisions, calls, errors
    /// by kind, fallbacks, breaker openings and closings.
    published: Mutex<[u64; 9]>,
}

impl Metrics {
    pub(crate) fn new(name: &str) -> Self {
        let name = SharedString::from(name.to_owned());
        Self {
            checks: Counts::new(name.clone()),
            name,
            errors: Default::default(),
            fallbacks: AtomicU64::new(0),
            published: Mutex::new([0; 9]),
        }
    }

    /// Counts a check's outcome.
    #[inline]
    pub(crate) fn check(&self, outcome: &Result<Decision, CheckError>, cost: u32) {
        self.checks.count(outcome, cost);
    }

    /// Counts a check the local half decided.
    #[inline]
    pub(crate) fn local(&self) {
        self.checks.count_local();
    }

    /// Records a call's outcome and, if it was sent, its time.
    pub(crate) fn call<T>(&self, sent: &Result<T, CallError>, took: Duration) {
        let kind = match sent {
            Ok(_) => None,
            Err(CallError::Unavailable(Unavailable::Timeout(_))) => Some(0),
            Err(CallError::Unavailable(Unavailable::Redis(_))) => Some(1),
            Err(CallError::Failed(_)) => Some(2),
            Err(CallError::Unavailable(Unavailable::BreakerOpen(_))) => Some(3),
        };
        if kind != Some(3) {
            histogram!("tollgate_redis_round_trip_seconds", "limiter" => self.name.clone())
                .record(took);
        }
        if let Some(kind) = kind {
            // Relaxed: a statistic; a failed call is no hot path.
            self.errors[kind].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a decision of the failure policy.
    pub(crate) fn fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// Hands the recorder what was counted since the last call: `calls`
    /// script calls so far, and the `breaker`'s state.
    pub(crate) fn publish(&self, calls: u64, breaker: &Breaker) {
        self.checks.publish(None);
        // Held while the totals are read and the recorder is told (see
        // `Counts::publish`); recorded as published before it runs.
        let mut held = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (open, opened, closed) = breaker.state();
        let errors = self
            .errors
            .each_ref()
            .map(|count| count.load(Ordering::Relaxed));
        let totals = [
            self.checks.local(),
            calls,
            errors[0],
            errors[1],
            errors[2],
            errors[3],
            self.fallbacks.load(Ordering::Relaxed),
            opened,
            closed,
        ];
        let published = std::mem::replace(&mut *held, totals);
        let since = |index: usize| totals[index].wrapping_sub(published[index]);
        let name = &self.name;
        counter!("tollgate_redis_local_decisions_total", "limiter" => name.clone())
            .increment(since(0));
        counter!("tollgate_redis_calls_total", "limiter" => name.clone()).increment(since(1));
        for (index, kind) in KINDS.iter().enumerate() {
            counter!("tollgate_redis_errors_total", "limiter" => name.clone(), "kind" => *kind)
                .increment(since(2 + index));
        }
        counter!("tollgate_redis_fallback_decisions_total", "limiter" => name.clone())
            .increment(since(6));
        for (to, index) in [("open", 7), ("closed", 8)] {
            counter!("tollgate_redis_breaker_transitions_total", "limiter" => name.clone(), "to" => to)
                .increment(since(index));
        }
        gauge!("tollgate_redis_breaker_open", "limiter" => name.clone()).set(if open {
            1.0
        } else {
            0.0
        });
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
