//! The Redis backend: a [`RedisLimiter`] per rule, so that every server
//! process on one Redis (standalone or Cluster) shares one count per
//! descriptor, decided exactly, with denials cached, or with leases, as
//! each rule's `mode` says.
//!
//! A request's descriptors are decided all or nothing by receipts, as the
//! HTTP layer's rules are: every enforced descriptor is checked at once,
//! and when one is refused the admissions of the others are given back
//! before the answer (undone if nothing was written on their keys since).
//! A give-back never over-admits: an admission a local half decided (a
//! lease's unit, a deny-cached limiter's admission, which has no
//! receipt), or one whose key moved on, stays charged (over-denial). While
//! Redis decides, nothing is over-admitted; when it cannot, the failure
//! policy answers (`admit` and `local` admit what Redis would not have).

use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tollgate::algorithm::{
    Carry, FixedWindow, Gcra, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use tollgate::remote::Leases;
use tollgate::store::ChangeError;
use tollgate::{Decision, Quota};
use tollgate_redis::{
    ConfigError, Connection, Enforced, Error, OnFailure, RedisLimiter, RedisReceipt, Scripted,
};

use crate::config::{self, Algorithm, Limit};
use crate::limits::{Backend, Descriptor, Limits, Name, Plan, Refused, Request, Status, ToCharge};

/// Limits held in Redis: one connection (a standalone server or a
/// Cluster) shared by every rule's limiter, and the failure policy each
/// applies when Redis cannot decide.
#[derive(Debug, Clone)]
pub struct Redis {
    connection: Connection,
    on_failure: OnFailure,
    prefix: String,
    cluster_skew: Option<Duration>,
}

impl Redis {
    /// Rules' limiters on `connection`, their keys under `prefix` (which
    /// must hold no `{` or `}`), deciding by `on_failure` while Redis
    /// cannot.
    #[must_use]
    pub fn new(connection: Connection, on_failure: OnFailure, prefix: impl Into<String>) -> Self {
        Redis {
            connection,
            on_failure,
            prefix: prefix.into(),
            cluster_skew: None,
        }
    }

    /// The most the clocks of a Cluster's masters differ by, which a rule
    /// deciding locally (`deny_cached`, `leased`) on a Cluster needs
    /// ([`tollgate_redis::Builder::cluster_clock_skew`]); without it such
    /// a rule is refused on a Cluster.
    #[must_use]
    pub fn cluster_clock_skew(mut self, skew: Duration) -> Self {
        self.cluster_skew = Some(skew);
        self
    }
}

/// A boxed future of a Redis call's outcome.
type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// One rule's limiter on Redis, whatever its algorithm.
pub trait RedisRule: Send + Sync + fmt::Debug {
    /// Checks `cost` units of `key`.
    fn check<'a>(&'a self, key: &'a str, cost: u32) -> Call<'a, Enforced>;
    /// Checks `cost` units of `key`, with what gives an admission Redis
    /// decided back.
    fn check_receipt<'a>(
        &'a self,
        key: &'a str,
        cost: u32,
    ) -> Call<'a, (Enforced, Option<RedisReceipt>)>;
    /// What a check of `key` would decide now, charging nothing.
    fn peek<'a>(&'a self, key: &'a str) -> Call<'a, Decision>;
    /// Changes the quota, each key carried by `carry` at its next check.
    ///
    /// # Errors
    ///
    /// As [`RedisLimiter::set_quota`].
    fn change(&self, quota: Quota, carry: Carry) -> Result<(), ConfigError>;
    /// The quota's revision (raised by each change).
    fn revision(&self) -> u32;
    /// Hands the `metrics` recorder what the limiter counted.
    fn publish_metrics(&self);
}

impl<A: Scripted> RedisRule for RedisLimiter<A> {
    fn check<'a>(&'a self, key: &'a str, cost: u32) -> Call<'a, Enforced> {
        Box::pin(self.check_n_enforced(key, cost))
    }

    fn check_receipt<'a>(
        &'a self,
        key: &'a str,
        cost: u32,
    ) -> Call<'a, (Enforced, Option<RedisReceipt>)> {
        Box::pin(self.check_n_receipt(key, cost, None))
    }

    fn peek<'a>(&'a self, key: &'a str) -> Call<'a, Decision> {
        Box::pin(RedisLimiter::peek(self, key))
    }

    fn change(&self, quota: Quota, carry: Carry) -> Result<(), ConfigError> {
        self.set_quota(quota, carry)
    }

    fn revision(&self) -> u32 {
        RedisLimiter::revision(self)
    }

    fn publish_metrics(&self) {
        RedisLimiter::publish_metrics(self);
    }
}

impl Redis {
    /// The limiter's name and key prefix. A rule's name is its path, and
    /// for a window algorithm its window too: a rule whose window changes
    /// starts on keys of its own (counts of another window mean nothing),
    /// while every other change keeps the keys and carries them. A limit
    /// requests bring is named by its domain, count and unit, under a
    /// prefix of its own (no rule's name can meet it).
    fn placed(&self, name: &Name<'_>, limit: &Limit) -> (String, String) {
        match *name {
            Name::Rule(path) => {
                let name = match limit.algorithm {
                    Algorithm::Gcra | Algorithm::TokenBucket => path.to_owned(),
                    Algorithm::FixedWindow
                    | Algorithm::SlidingWindowCounter
                    | Algorithm::SlidingWindowLog => {
                        format!("{path}@{}us", limit.unit.span().as_micros())
                    }
                };
                (name, self.prefix.clone())
            }
            Name::Brought {
                domain,
                count,
                unit,
            } => (
                format!("{domain}/{count}/{}s", unit.span().as_secs()),
                format!("{}brought:", self.prefix),
            ),
        }
    }

    /// A limiter named by `name` enforcing `limit` from revision
    /// `revision`, a key stamped by an earlier one carried by its carry.
    fn build(
        &self,
        name: &Name<'_>,
        limit: &Limit,
        max_keys: NonZeroUsize,
        (revision, carry): (u32, Carry),
    ) -> Result<Arc<dyn RedisRule>, String> {
        let (placed, prefix) = self.placed(name, limit);
        let mut builder = RedisLimiter::builder(placed, limit.quota)
            .prefix(prefix)
            .on_failure(self.on_failure)
            .local_keys(max_keys)
            .revision(revision, carry)
            .mode(match limit.mode {
                config::Mode::Exact => tollgate_redis::Mode::Exact,
                config::Mode::DenyCached => tollgate_redis::Mode::DenyCached,
                config::Mode::Leased => tollgate_redis::Mode::Leased(Leases::new()),
            });
        if matches!(name, Name::Rule(_)) {
            builder = builder.metrics();
        }
        if let Some(skew) = self.cluster_skew {
            builder = builder.cluster_clock_skew(skew);
        }
        let connection = self.connection.clone();
        match limit.algorithm {
            Algorithm::FixedWindow => built(builder.algorithm::<FixedWindow>().build(connection)),
            Algorithm::Gcra => built(builder.algorithm::<Gcra>().build(connection)),
            Algorithm::TokenBucket => built(builder.algorithm::<TokenBucket>().build(connection)),
            Algorithm::SlidingWindowCounter => built(
                builder
                    .algorithm::<SlidingWindowCounter>()
                    .build(connection),
            ),
            Algorithm::SlidingWindowLog => {
                built(builder.algorithm::<SlidingWindowLog>().build(connection))
            }
        }
    }
}

impl Backend for Redis {
    type Limiter = Arc<dyn RedisRule>;

    /// A [`RedisLimiter`] of `limit`'s algorithm, quota and mode, its local
    /// half (a mode other than exact) holding at most `max_keys` keys; a
    /// rule's counts its checks for the `metrics` facade under its name
    /// (a limit requests bring does not: its name is theirs to choose).
    fn limiter(
        &self,
        name: &Name<'_>,
        limit: &Limit,
        max_keys: NonZeroUsize,
    ) -> Result<Self::Limiter, String> {
        self.build(name, limit, max_keys, (0, Carry::AsIs))
    }

    /// A limiter of the new mode, on the same keys: of the next revision
    /// when the quota changed too (each key carried by `carry` at its next
    /// check), else of the same.
    fn remade(
        &self,
        held: &Self::Limiter,
        path: &str,
        (old, new, carry): (&Limit, &Limit, Carry),
        max_keys: NonZeroUsize,
    ) -> Option<Result<Self::Limiter, String>> {
        if old.mode == new.mode {
            return None;
        }
        let revision = if old.quota == new.quota {
            Some(held.revision())
        } else {
            held.revision().checked_add(1)
        };
        Some(match revision {
            Some(revision) => self.build(&Name::Rule(path), new, max_keys, (revision, carry)),
            None => Err("its quota's revisions are exhausted".to_owned()),
        })
    }

    fn change(limiter: &Self::Limiter, quota: Quota, carry: Carry) -> Result<(), Refused> {
        limiter
            .change(quota, carry)
            .map_err(|refused| match refused {
                ConfigError::Change(ChangeError::Reclaiming) => Refused::Later,
                refused => Refused::Never(refused.to_string()),
            })
    }

    /// Nothing: Redis expires its keys, and a local half holds at most its
    /// keys.
    fn evict_idle(_limiter: &Self::Limiter) -> usize {
        0
    }

    /// Under the `local` failure policy, its share of the limit (kept, so
    /// that an outage does not start it afresh at every tick); otherwise
    /// nothing a new limiter would not have: the state is in Redis, and a
    /// limit requests bring is decided exactly, so no lease is lost.
    fn holds_state(&self, _limiter: &Self::Limiter) -> bool {
        matches!(self.on_failure, OnFailure::Local { .. })
    }
}

/// A built limiter as a rule's, or why it could not be built.
fn built<A: Scripted>(
    limiter: Result<RedisLimiter<A>, ConfigError>,
) -> Result<Arc<dyn RedisRule>, String> {
    limiter
        .map(|limiter| Arc::new(limiter) as Arc<dyn RedisRule>)
        .map_err(|refused| refused.to_string())
}

/// A check of a rule on Redis.
type Check = ToCharge<Arc<dyn RedisRule>>;

impl Limits<Redis> {
    /// Decides `request` as [`Limits::<Memory>::decide`](crate::limits::Limits)
    /// does, on Redis: the enforced descriptors all or nothing (by
    /// receipts: a refused request's admissions are given back before the
    /// answer), the descriptors of rules in shadow mode and of cost 0 at
    /// the same time. A descriptor admitted and given back shows the
    /// decision its check returned.
    ///
    /// # Errors
    ///
    /// Under the `error` failure policy only: [`Error::Unavailable`] when
    /// Redis cannot decide an enforced descriptor, and the errors of a
    /// failed script (the other descriptors' admissions stay charged).
    /// Under any other policy a failed script holds the request over the
    /// limit.
    pub async fn decide<D: Descriptor>(
        &self,
        request: &Request<'_, D>,
    ) -> Result<Vec<Status>, Error> {
        let Plan {
            mut statuses,
            enforced,
            shadow,
            peeked,
            blocked,
        } = self.plan(request);
        let peeks = if blocked {
            enforced.iter().chain(&peeked).collect()
        } else {
            peeked.iter().collect::<Vec<_>>()
        };
        let (charged, watched, peeked) = tokio::join!(
            charge_all(if blocked { &[] } else { &enforced[..] }),
            join_all(
                shadow
                    .iter()
                    .map(|check| check.limiter.check(&check.key, check.cost))
            ),
            join_all(peeks.iter().map(|check| check.limiter.peek(&check.key))),
        );
        let charged = match charged {
            Ok(charged) => charged,
            Err(failed) if self.backend().on_failure == OnFailure::Error => return Err(failed),
            // Under any other policy Redis's unavailability is the policy's
            // to answer, and never reaches here: this is a failure the
            // policy does not cover (a script refused, a reply malformed,
            // a Cluster node asked without `--redis-cluster`). Over the
            // limit: closed, whatever the policy.
            Err(failed) => {
                tracing::warn!(%failed, "Redis failed a check: its request is over the limit");
                vec![None; enforced.len()]
            }
        };
        for (check, outcome) in enforced.iter().zip(charged) {
            let status = &mut statuses[check.index];
            match outcome {
                Some(decision) => {
                    status.over_limit = !decision.is_allowed();
                    status.decision = Some(decision);
                }
                // A cost the limit can never admit.
                None => status.over_limit = true,
            }
        }
        for (check, outcome) in shadow.iter().zip(watched) {
            let status = &mut statuses[check.index];
            match outcome {
                Ok(enforced) => {
                    status.shadow_refused = !enforced.decision.is_allowed();
                    status.decision = Some(enforced.decision);
                }
                Err(Error::Check(_)) => status.shadow_refused = true,
                // Not known: a rule in shadow mode never answers for Redis.
                Err(_) => {}
            }
        }
        for (check, outcome) in peeks.iter().zip(peeked) {
            if let Ok(decision) = outcome {
                statuses[check.index].decision = Some(decision);
            }
        }
        Ok(statuses)
    }

    /// Hands the `metrics` recorder what every rule's limiter counted:
    /// checks, local decisions, round trips, errors and the breaker.
    pub fn publish_metrics(&self) {
        for (_, limiter) in self.limiters() {
            limiter.publish_metrics();
        }
    }
}

/// Checks `enforced` all or nothing: each one's decision, or `None` for a
/// cost its limit can never admit. When any is refused, the admissions of
/// the others are given back (awaited) before this returns; when Redis
/// fails one, nothing is given back and the failure is returned.
async fn charge_all(enforced: &[Check]) -> Result<Vec<Option<Decision>>, Error> {
    if let [only] = enforced {
        // Nothing to give back to.
        return match only.limiter.check(&only.key, only.cost).await {
            Ok(enforced) => Ok(vec![Some(enforced.decision)]),
            Err(Error::Check(_)) => Ok(vec![None]),
            Err(failed) => Err(failed),
        };
    }
    let outcomes = join_all(
        enforced
            .iter()
            .map(|check| check.limiter.check_receipt(&check.key, check.cost)),
    )
    .await;
    let mut decisions = Vec::with_capacity(outcomes.len());
    let mut receipts = Vec::new();
    let mut failure = None;
    for outcome in outcomes {
        match outcome {
            Ok((enforced, receipt)) => {
                decisions.push(Some(enforced.decision));
                if enforced.decision.is_allowed() {
                    receipts.extend(receipt);
                }
            }
            Err(Error::Check(_)) => decisions.push(None),
            Err(failed) => {
                decisions.push(None);
                failure.get_or_insert(failed);
            }
        }
    }
    if let Some(failed) = failure {
        // Nothing is given back: the answer is the failure's, which a
        // proxy may read as leave to pass (Envoy does, unless
        // `failure_mode_deny`), and a request passed must have been
        // charged where it could be.
        return Err(failed);
    }
    let refused = decisions
        .iter()
        .any(|decision| decision.is_none_or(|decision| !decision.is_allowed()));
    if refused {
        // A refund that fails, or finds its key moved on, leaves the
        // admission charged: over-denial, never over-admission.
        join_all(receipts.into_iter().map(RedisReceipt::refund)).await;
    }
    Ok(decisions)
}
