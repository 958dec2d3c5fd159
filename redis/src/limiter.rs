//! [`RedisLimiter`]: the contract of [`tollgate`]'s limiters, decided by
//! Redis. This file holds the limiter and its check path; building it,
//! the time each call is decided at, checks of several limits together,
//! the script's arguments and replies, and reservations each have a file
//! of their own below it.

mod builder;
mod multi;
mod reserve;
mod time;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::algorithm::{Gcra, validate_cost};
use tollgate::remote::Local;
use tollgate::{Decision, Quota};

use crate::connection::{CallError, Connection};
use crate::error::Error;
use crate::failure::{Enforced, Fallback, Unavailable};
use crate::key::Namespace;
use crate::local::{Hybrid, Mode};
use crate::script::{ScriptLimit, Scripted};

pub use builder::Builder;
pub use multi::{Decisions, Request, check_all};
pub use reserve::RedisReservation;

use time::{Now, Time};
use wire::{
    Call, Counts, Entry, Op, Script, decision, evaluate, lease_arguments, lease_reply, malformed,
};

/// A rate limiter whose state lives in Redis, so that every instance of a
/// service shares one count per key.
///
/// Each check is one round trip: the script (all five algorithms, see
/// [`SCRIPT`](crate::SCRIPT)) is called by its SHA-1 with `EVALSHA`, and
/// sent whole with `EVAL` only when the server answers that it does not
/// know it (after a restart or `SCRIPT FLUSH`); no error reaches the caller
/// for that.
///
/// # Exact to the microsecond
///
/// The script decides in integer microseconds (Lua numbers are doubles,
/// exact below 2^53: nanoseconds since 1970 do not fit, microseconds do).
/// The quota's interval or window is rounded **up** to a whole microsecond
/// and a client time **down**, so the limiter never admits more than the
/// quota; `retry_after` is actionable (a retry after it succeeds). With the
/// server's clock (the default) waits are whole microseconds; with a client
/// clock ([`Builder::clock`]) they are exact to the nanosecond against
/// that clock, on a grid of whole microseconds.
///
/// ```no_run
/// use tollgate::Quota;
/// use tollgate_redis::{Connection, RedisLimiter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let connection = Connection::open("redis://127.0.0.1:6379/").await?;
/// let limiter = RedisLimiter::builder("api", Quota::per_minute(100)?).build(connection)?;
/// let decision = limiter.check("203.0.113.7").await?;
/// if !decision.is_allowed() {
///     // 429, with Retry-After: decision.retry_after()
/// }
/// # Ok(())
/// # }
/// ```
pub struct RedisLimiter<A: Scripted = Gcra> {
    core: Core,
    quota: Quota,
    fallback: Fallback<A>,
    /// What is decided locally ([`Mode`]); `None`: every check on Redis.
    local: Option<Arc<Hybrid>>,
    /// Script calls sent by checks and peeks.
    calls: AtomicU64,
}

/// What a check needs of its limiter, whatever the algorithm: the part
/// [`check_all`] shares across limiters of different algorithms.
struct Core {
    connection: Connection,
    namespace: Namespace,
    limit: ScriptLimit,
    time: Time,
    grace_ms: u64,
    script: Arc<Script>,
}

impl<A: Scripted> RedisLimiter<A> {
    /// Checks one unit for `key`.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis cannot decide and the failure
    /// policy is [`OnFailure::Error`](crate::OnFailure::Error) (else the
    /// policy decides), [`Error::Script`] when the script fails,
    /// [`Error::Reply`] for a malformed answer.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, Error> {
        self.check_n(key, 1).await
    }

    /// Checks `cost` units for `key`, all or nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Check`] for a cost of zero or above the burst (no round
    /// trip), and as [`check`](RedisLimiter::check).
    pub async fn check_n(&self, key: impl AsRef<[u8]>, cost: u32) -> Result<Decision, Error> {
        Ok(self.check_n_enforced(key, cost).await?.decision)
    }

    /// Checks `cost` units for `key`, as [`check_n`](RedisLimiter::check_n),
    /// and says which quota decided: the limiter's own, or while Redis
    /// cannot decide, the one its failure policy enforces in its place
    /// ([`Enforced::quota`]). What a client is told of the quota (the
    /// `RateLimit-Policy` field) is that one.
    ///
    /// ```no_run
    /// use tollgate::Quota;
    /// use tollgate_redis::{Connection, OnFailure, RedisLimiter};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = Connection::open("redis://127.0.0.1:6379/").await?;
    /// let limiter = RedisLimiter::builder("api", Quota::per_minute(20)?)
    ///     .on_failure(OnFailure::Local { instances: 3 })
    ///     .build(connection)?;
    /// let enforced = limiter.check_n_enforced("203.0.113.7", 1).await?;
    /// match enforced.quota {
    ///     // 20 while Redis decides; 6, in process, while it cannot.
    ///     Some(quota) => println!("{} a minute", quota.limit()),
    ///     None => println!("the failure policy decided, counting nothing"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check_n`](RedisLimiter::check_n).
    pub async fn check_n_enforced(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
    ) -> Result<Enforced, Error> {
        self.decide(key.as_ref(), cost, false).await
    }

    /// Returns what a unit check would decide now, changing nothing and
    /// storing no key.
    ///
    /// # Errors
    ///
    /// As [`check`](RedisLimiter::check).
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<Decision, Error> {
        Ok(self.decide(key.as_ref(), 1, true).await?.decision)
    }

    /// Returns the quota every key is held to.
    #[must_use]
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// Returns the quota's burst: the most unit requests a key admits at
    /// once.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.core.limit.burst
    }

    /// Returns the `SCAN` pattern that matches every key this limiter
    /// writes.
    #[must_use]
    pub fn key_pattern(&self) -> Vec<u8> {
        self.core.namespace.pattern()
    }

    /// Returns the Redis key that holds `key`'s state.
    #[must_use]
    pub fn redis_key(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        self.core.namespace.key(key.as_ref())
    }

    /// Returns how many script calls this limiter's checks and peeks
    /// attempted (those that failed included, those the circuit breaker
    /// kept back not): with a [`Mode`] that decides locally, how many
    /// checks asked Redis.
    #[must_use]
    pub fn remote_calls(&self) -> u64 {
        // Relaxed: a statistic, ordered with nothing.
        self.calls.load(Ordering::Relaxed)
    }

    /// Decides a check (or a peek): locally if the local half can, else on
    /// Redis, else by the failure policy.
    async fn decide(&self, key: &[u8], cost: u32, peek: bool) -> Result<Enforced, Error> {
        let core = &self.core;
        validate_cost(cost, core.limit.burst)?;
        let Some(hybrid) = &self.local else {
            return self.on_redis(key, cost, peek, core.time.now()).await;
        };
        if peek {
            return match hybrid.view.peek(key, cost)? {
                Some(decision) => Ok(self.by_quota(decision)),
                None => self.on_redis(key, cost, true, core.time.now()).await,
            };
        }
        let ask = match hybrid.view.check(key, cost)? {
            Local::Decided(decision) => return Ok(self.by_quota(decision)),
            Local::Ask(ask) => ask,
        };
        // A client clock decides at the ask's reading (taken after the
        // view's decision, before the call).
        let now = core.time.at(ask.sent_ns());
        let redis_key = core.namespace.key(key);
        let request = *ask.request();
        let sent = evaluate(&core.connection, &core.script, |name, body| {
            let mut command = redis::cmd(name);
            command.arg(body).arg(1).arg(&redis_key);
            lease_arguments(&mut command, &now, &hybrid.quota, &request, core.grace_ms);
            command
        })
        .await;
        self.count(&sent);
        match sent {
            Ok(replies) => {
                let reply = lease_reply(&replies, &request)?;
                ask.complete(&reply);
                // The units this instance may admit now: its lease's, and
                // those still free on Redis.
                let remaining = reply.remaining.saturating_add(reply.granted);
                let counts = Counts {
                    allowed: reply.allowed,
                    remaining: remaining.min(core.limit.burst),
                    retry_us: reply.retry_us,
                    reset_us: reply.reset_us,
                };
                counts
                    .decision(core.limit.burst, &now)
                    .map(|decision| self.by_quota(decision))
                    .ok_or_else(|| malformed(&replies))
            }
            Err(CallError::Unavailable(cause)) => {
                if matches!(cause, Unavailable::BreakerOpen(_)) {
                    // Never sent: the lease's units are still this
                    // instance's to spend.
                    ask.not_sent();
                } else {
                    // May have run: the units it gave back may be Redis's
                    // again. Dropping the ask drops them here.
                    drop(ask);
                }
                self.fall_back(key, cost, false, cause)
            }
            Err(failed) => Err(failed.into()),
        }
    }

    /// Decides on Redis (modes "0" and "1").
    async fn on_redis(
        &self,
        key: &[u8],
        cost: u32,
        peek: bool,
        now: Now,
    ) -> Result<Enforced, Error> {
        let core = &self.core;
        let entry = core.entry(core.namespace.key(key), cost, &now);
        let call = Call::new(
            if peek { Op::Peek } else { Op::Check },
            std::slice::from_ref(&entry),
        );
        let sent = call.send(&core.connection, &core.script).await;
        self.count(&sent);
        match sent {
            Ok(replies) => {
                decision(&replies, core.limit.burst, &now).map(|decision| self.by_quota(decision))
            }
            Err(CallError::Unavailable(cause)) => self.fall_back(key, cost, peek, cause),
            Err(failed) => Err(failed.into()),
        }
    }

    /// Counts a call that was attempted (not one the breaker kept back).
    fn count(&self, sent: &Result<Vec<i64>, CallError>) {
        if !matches!(
            sent,
            Err(CallError::Unavailable(Unavailable::BreakerOpen(_)))
        ) {
            // Relaxed: a statistic, ordered with nothing.
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Marks `decision` as made by this limiter's quota (by Redis, or from
    /// what Redis told this instance).
    fn by_quota(&self, decision: Decision) -> Enforced {
        Enforced {
            decision,
            quota: Some(self.quota),
        }
    }

    /// Returns the failure policy's answer for a check Redis did not
    /// decide.
    fn fall_back(
        &self,
        key: &[u8],
        cost: u32,
        peek: bool,
        cause: Unavailable,
    ) -> Result<Enforced, Error> {
        let core = &self.core;
        let open_for = match cause {
            Unavailable::BreakerOpen(open_for) => open_for,
            _ => core.connection.breaker().admit_peek().unwrap_or_default(),
        };
        self.fallback
            .decide(key, cost, peek, core.limit.burst, open_for, cause)
    }
}

impl Core {
    /// Returns this limiter's part of a call: `cost` units for the Redis
    /// key `key` at `now`.
    fn entry<'a>(&self, key: Vec<u8>, cost: u32, now: &'a Now) -> Entry<'a> {
        Entry {
            key,
            limit: self.limit,
            cost,
            now,
            grace_ms: self.grace_ms,
        }
    }
}

impl<A: Scripted> std::fmt::Debug for RedisLimiter<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("algorithm", &std::any::type_name::<A>())
            .field("namespace", &self.core.namespace)
            .field("limit", &self.core.limit)
            .field("time", &self.core.time.describe())
            .field("on_failure", &self.fallback.policy())
            .field(
                "mode",
                &self.local.as_ref().map_or(Mode::Exact, |local| local.mode),
            )
            .field(
                "bound",
                &self.local.as_ref().map_or_else(
                    || Mode::EXACT_BOUND.to_owned(),
                    |local| local.mode.bound(&local.quota),
                ),
            )
            .field("connection", &self.core.connection)
            .finish_non_exhaustive()
    }
}
