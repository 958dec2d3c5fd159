//! [`RedisLimiter`]: the contract of [`tollgate`]'s limiters, decided by
//! Redis. This file holds the limiter and its check path; building it,
//! the time each call is decided at, checks of several limits together,
//! the script's arguments and replies, and reservations each have a file
//! of their own below it.

mod builder;
mod multi;
mod receipt;
mod reserve;
mod time;
mod wire;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use tollgate::algorithm::{Carry, Gcra, validate_cost};
use tollgate::remote::{Ask, Local, RemoteError, RemoteQuota};
use tollgate::store::ChangeError;
use tollgate::{CheckError, Decision, LayoutError, Quota};

use crate::connection::{CallError, Connection};
use crate::error::{ConfigError, Error};
use crate::failure::{Enforced, Fallback, Unavailable};
use crate::key::Namespace;
use crate::local::{Flight, Hybrid, Mode};
use crate::script::{ScriptLimit, Scripted};

pub use builder::Builder;
pub use multi::{Decisions, Request, check_all};
pub use receipt::RedisReceipt;
pub use reserve::RedisReservation;

use time::{Now, Time};
use wire::{
    Call, Counts, Entry, Op, Replied, Script, Stamp, carry_code, decision, evaluate,
    lease_arguments, lease_reply, malformed,
};

/// The most replies of other checks' asks a check that misses waits for
/// (waiting again only while Redis denies) before it asks Redis itself;
/// each wait lasts at most the call timeout. A yield to a claimant that has
/// not registered its flight yet counts as a wait.
const MAX_WAITS: u32 = 4;

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
    fallback: Fallback<A>,
    /// What is decided locally ([`Mode`]); `None`: every check on Redis.
    local: Option<Arc<Hybrid>>,
    /// Script calls sent by checks and peeks.
    calls: AtomicU64,
    /// Held by [`set_quota`](RedisLimiter::set_quota): one change at a
    /// time, each from the quota the last one left.
    changing: Mutex<()>,
    /// Its counts for the `metrics` facade ([`Builder::metrics`]).
    #[cfg(feature = "metrics")]
    metrics: Option<crate::metrics::Metrics>,
}

/// What a check needs of its limiter, whatever the algorithm: the part
/// [`check_all`] shares across limiters of different algorithms.
struct Core {
    connection: Connection,
    namespace: Namespace,
    /// The quota checks decide by, swapped whole by a change.
    quota: ArcSwap<Current>,
    time: Time,
    grace_ms: u64,
    script: Arc<Script>,
    /// Refunds in flight in tasks of their own ([`RedisReceipt::refund_later`]).
    refunds: Arc<AtomicUsize>,
}

/// A limiter's quota, and what the script stamps values with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Current {
    quota: Quota,
    stamp: Stamp,
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
        self.checked(self.decide(key.as_ref(), cost, Op::Check, None).await, cost)
            .map(|(enforced, _)| enforced)
    }

    /// Returns what a unit check would decide now, changing nothing and
    /// storing no key.
    ///
    /// # Errors
    ///
    /// As [`check`](RedisLimiter::check).
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<Decision, Error> {
        Ok(self
            .decide(key.as_ref(), 1, Op::Peek, None)
            .await?
            .0
            .decision)
    }

    /// Checks one unit for `key` under `quota` rather than the limiter's
    /// own: a tier's quota, chosen per request. The key's state is read as
    /// it stands, as a check of the limiter's own quota left it (a key
    /// stamped by an earlier revision is first carried over to `quota` by
    /// the limiter's strategy, as [`set_quota`](RedisLimiter::set_quota)
    /// says), and written stamped with `quota`. Every instance may check one
    /// key under different quotas; each decision is its quota's. A limiter
    /// deciding locally ([`Mode`]) denies such a check locally as Redis
    /// would by `quota`, and never spends its leases on it (a `quota` equal
    /// to the limiter's own is checked as its own); the first 16
    /// quotas other than its own get local decisions, any further quota is
    /// decided by Redis on every check.
    ///
    /// ```no_run
    /// use tollgate::Quota;
    /// use tollgate_redis::{Connection, RedisLimiter};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = Connection::open("redis://127.0.0.1:6379/").await?;
    /// let free = Quota::per_minute(10)?;
    /// let pro = Quota::per_minute(1_000)?;
    /// let limiter = RedisLimiter::builder("api", free).build(connection)?;
    /// let decision = limiter.check_with("customer-42", &pro).await?;
    /// assert_eq!(decision.limit(), 1_000);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check`](RedisLimiter::check); [`Error::Check`] with
    /// [`CheckError::Layout`] for a window algorithm and a quota of another
    /// window (its counts mean nothing in other windows), and
    /// [`Error::Quota`] for a quota the script (or the local half of a
    /// limiter deciding locally) cannot hold.
    pub async fn check_with(
        &self,
        key: impl AsRef<[u8]>,
        quota: &Quota,
    ) -> Result<Decision, Error> {
        self.check_n_with(key, 1, quota).await
    }

    /// [`check_n`](RedisLimiter::check_n) under `quota`, as
    /// [`check_with`](RedisLimiter::check_with).
    ///
    /// # Errors
    ///
    /// As [`check_with`](RedisLimiter::check_with), the cost judged against
    /// `quota`'s burst.
    pub async fn check_n_with(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        quota: &Quota,
    ) -> Result<Decision, Error> {
        Ok(self.check_n_enforced_with(key, cost, quota).await?.decision)
    }

    /// [`check_n_enforced`](RedisLimiter::check_n_enforced) under `quota`,
    /// as [`check_with`](RedisLimiter::check_with): the quota that decided
    /// is `quota`, or its share under
    /// [`OnFailure::Local`](crate::OnFailure::Local) while Redis cannot
    /// decide.
    ///
    /// # Errors
    ///
    /// As [`check_with`](RedisLimiter::check_with).
    pub async fn check_n_enforced_with(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        quota: &Quota,
    ) -> Result<Enforced, Error> {
        self.checked(
            self.decide(key.as_ref(), cost, Op::Check, Some(quota))
                .await,
            cost,
        )
        .map(|(enforced, _)| enforced)
    }

    /// Checks `cost` units for `key`, under `quota` if given (as
    /// [`check_with`](RedisLimiter::check_with)) and the limiter's own
    /// otherwise, as [`check_n_enforced`](RedisLimiter::check_n_enforced),
    /// with a receipt for an admission Redis decided: what gives it back
    /// when another limit refuses the same request
    /// ([`RedisReceipt::refund`]). The layer's rules use it. An admission
    /// the local half decided (a [`Mode`] other than `Exact`), or the
    /// failure policy, has none: it stays charged.
    ///
    /// ```no_run
    /// use tollgate::Quota;
    /// use tollgate_redis::{Connection, RedisLimiter};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = Connection::open("redis://127.0.0.1:6379/").await?;
    /// let per_user = RedisLimiter::builder("user", Quota::per_minute(10)?).build(connection)?;
    /// let (enforced, receipt) = per_user.check_n_receipt("alice", 1, None).await?;
    /// let refused_elsewhere = true;
    /// if let (true, Some(receipt)) = (refused_elsewhere, receipt) {
    ///     // Alice's unit is hers again, unless someone was admitted since.
    ///     receipt.refund().await?;
    /// }
    /// # let _ = enforced;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check_with`](RedisLimiter::check_with) with a quota, and as
    /// [`check_n`](RedisLimiter::check_n) without.
    pub async fn check_n_receipt(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        quota: Option<&Quota>,
    ) -> Result<(Enforced, Option<RedisReceipt>), Error> {
        self.checked(
            self.decide(key.as_ref(), cost, Op::CheckReceipt, quota)
                .await,
            cost,
        )
    }

    /// Whether checks can carry `quota`
    /// ([`check_with`](RedisLimiter::check_with)), asked when a tier is
    /// configured rather than on its first request.
    ///
    /// # Errors
    ///
    /// The error every check carrying `quota` would return for it.
    pub fn accepts(&self, quota: &Quota) -> Result<(), Error> {
        self.stamp_for(quota).map(drop)
    }

    /// Replaces the quota every later check of this limiter decides by,
    /// keeping each key's state: a key is carried over to the new quota by
    /// `carry` ([`Carry`]: as is, in proportion, or unchanged), once, on its
    /// first check after the change (its own instant of change), by the
    /// script, atomically with that check.
    ///
    /// The key in Redis does not change with the quota: every value carries
    /// the stamp of the quota that wrote it (the quota and its revision, a
    /// number this call raises by one; [`Builder::revision`] sets the first).
    /// Instances of one service share keys, so a change reaches each key
    /// from whichever instance checks it first:
    ///
    /// * a check of a later revision than a key's stamp carries the key over
    ///   to its quota by its strategy, and stamps it;
    /// * a check of the same revision reads the state as it stands (as a
    ///   [`check_with`](RedisLimiter::check_with) does);
    /// * a check of an earlier revision (an instance not yet changed, in a
    ///   rolling deploy) reads it as it stands too, deciding by its own
    ///   quota, and leaves the later stamp: no key is carried back and forth.
    ///
    /// So the instances of a service must agree on what each revision is: a
    /// service changes its quota on every instance, in the same order (or
    /// declares the revision with [`Builder::revision`] at start-up).
    ///
    /// What a window spanning a key's carry can admit is note 14's bound:
    /// at most the larger burst plus what each quota refills in its part.
    ///
    /// A limiter deciding locally ([`Mode`] other than `Exact`) forgets what
    /// it knew of every key: a key's next check asks Redis (which carries
    /// it), and the units of the leases it held are dropped (Redis counts
    /// them spent: under-admission only). It does so whatever the quota,
    /// so call this when the quota changes, not on every reload of an
    /// unchanged configuration. An instance still on the old
    /// revision spends its leases' units until their deadlines: a window
    /// starting within a tolerance of a key's carry may admit, beyond the
    /// bound, the units such instances held on the key (see note 14).
    ///
    /// ```no_run
    /// use tollgate::Quota;
    /// use tollgate::algorithm::Carry;
    /// use tollgate_redis::{Connection, RedisLimiter};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = Connection::open("redis://127.0.0.1:6379/").await?;
    /// let limiter = RedisLimiter::builder("api", Quota::per_minute(100)?).build(connection)?;
    /// limiter.set_quota(Quota::per_minute(200)?, Carry::Proportional)?;
    /// assert_eq!((limiter.quota().limit(), limiter.revision()), (200, 1));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Nothing changes on an error (but for the failure policy's share,
    /// below): [`ConfigError::QuotaTooLarge`] for a
    /// quota the script cannot hold, [`ConfigError::Change`] for a window
    /// algorithm and a quota of another window, or a strategy the script
    /// does not implement, [`ConfigError::ShareTooSmall`] (and the other
    /// errors of [`Builder::build`]) for the failure policy's local share,
    /// [`ConfigError::RevisionsExhausted`] after 2^32 − 1 revisions, and,
    /// for a limiter deciding locally, [`ConfigError::Local`] for leases
    /// whose slack is too long at the new interval and, rarely,
    /// [`ConfigError::Change`] with [`ChangeError::Reclaiming`] while a
    /// check stalled inside the local half's table holds it back: try
    /// again. The share's own change refuses nothing once the share is
    /// accepted; should it, its error is returned, the limiter's quota
    /// changed all the same and the share still on the old one.
    pub fn set_quota(&self, quota: Quota, carry: Carry) -> Result<(), ConfigError> {
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let current = **self.core.quota.load();
        let limit = ScriptLimit::new::<A>(&quota)?;
        same_window::<A>(&current, &quota, &limit).map_err(ChangeError::Layout)?;
        let code = carry_code(carry).ok_or(ChangeError::Unsupported)?;
        let revision = current
            .stamp
            .revision
            .checked_add(1)
            .ok_or(ConfigError::RevisionsExhausted)?;
        self.fallback.accepts(&quota)?;
        let next = Current {
            quota,
            stamp: Stamp {
                limit,
                revision,
                carry: code,
            },
        };
        if let Some(hybrid) = &self.local {
            // First, since it alone can still refuse (a check stalled in
            // its table): nothing has changed then.
            hybrid
                .view
                .set_quota(remote_quota(&limit)?, Some(next))
                .map_err(|refused| match refused {
                    RemoteError::Change(change) => ConfigError::Change(change),
                    other => ConfigError::Local(other),
                })?;
        }
        // The share was accepted above; its change refuses nothing then (a
        // mutex store, a strategy it implements). Should it refuse all the
        // same, the limiter's quota still changes with its local half (a
        // revision is never reused) and the share keeps the old quota.
        let shared = self.fallback.set_quota(&quota, carry);
        self.core.quota.store(Arc::new(next));
        shared
    }

    /// Returns the quota every key is held to.
    #[must_use]
    pub fn quota(&self) -> Quota {
        self.core.quota.load().quota
    }

    /// Returns the revision of the quota ([`set_quota`](RedisLimiter::set_quota)).
    #[must_use]
    pub fn revision(&self) -> u32 {
        self.core.quota.load().stamp.revision
    }

    /// Returns the quota's burst: the most unit requests a key admits at
    /// once.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.core.quota.load().stamp.limit.burst
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

    /// The stamp checks carrying `quota` write, with the limiter's
    /// revision and strategy.
    fn stamp_for(&self, quota: &Quota) -> Result<Stamp, Error> {
        let current = self.core.quota.load();
        let limit = ScriptLimit::new::<A>(quota).map_err(Error::Quota)?;
        same_window::<A>(&current, quota, &limit).map_err(CheckError::Layout)?;
        if self.local.is_some() {
            remote_quota(&limit).map_err(Error::Quota)?;
        }
        Ok(Stamp {
            limit,
            ..current.stamp
        })
    }

    /// Decides a check (`op`: with a receipt or not) or a peek, under
    /// `carried` or else the limiter's own quota: locally if the local half
    /// can, else on Redis, else by the failure policy. Only an admission
    /// Redis decided has a receipt.
    async fn decide(
        &self,
        key: &[u8],
        cost: u32,
        op: Op,
        carried: Option<&Quota>,
    ) -> Result<(Enforced, Option<RedisReceipt>), Error> {
        let core = &self.core;
        let Some(hybrid) = &self.local else {
            let (quota, stamp) = if let Some(quota) = carried {
                (*quota, self.stamp_for(quota)?)
            } else {
                let current = core.quota.load();
                (current.quota, current.stamp)
            };
            validate_cost(cost, stamp.limit.burst)?;
            return self
                .on_redis(key, cost, op, core.time.now(), &stamp, quota, carried)
                .await;
        };
        // A check carrying its quota: its script limit and remote quota.
        let tier = match carried {
            Some(quota) => {
                let limit = ScriptLimit::new::<A>(quota).map_err(Error::Quota)?;
                Some((*quota, limit, remote_quota(&limit).map_err(Error::Quota)?))
            }
            None => None,
        };
        // Whose quota decided, and the stamp it writes: the view's
        // generation's (so a check racing a change sends the quota and
        // revision its local decision was taken by), or the one carried.
        let under = |payload: Option<Current>| {
            let current = payload.unwrap_or_else(|| **core.quota.load());
            match tier {
                Some((quota, limit, _)) => (
                    quota,
                    Stamp {
                        limit,
                        ..current.stamp
                    },
                ),
                None => (current.quota, current.stamp),
            }
        };
        if op == Op::Peek {
            // A peek carrying its quota is Redis's.
            let local = if tier.is_some() {
                None
            } else {
                hybrid.view.peek(key, cost)?
            };
            if let Some((decision, payload)) = local {
                return Ok((by_quota(decision, under(payload).0), None));
            }
            let (quota, stamp) = under(None);
            validate_cost(cost, stamp.limit.burst)?;
            return self
                .on_redis(key, cost, Op::Peek, core.time.now(), &stamp, quota, carried)
                .await;
        }
        // A local decision is made into its answer inside the table: only
        // that comes back (the hot path's copies stay small).
        let decided = |decision: Decision, payload: &Option<Current>| match tier {
            Some((quota, ..)) => by_quota(decision, quota),
            None => by_quota(
                decision,
                payload
                    .as_ref()
                    .map_or_else(|| core.quota.load().quota, |current| current.quota),
            ),
        };
        // A check that misses while its key's claimed ask is in flight
        // waits for that reply and decides again from it: on a hot key,
        // the checks arriving during a round trip would otherwise each ask
        // too. Waiting changes no decision's rule, only its instant. It
        // waits again only while Redis denies (a key over its limit), at
        // most `MAX_WAITS` times, each wait at most a call's timeout; after
        // an admission, a failure or a wait that timed out, it asks itself.
        // A key with room is not waited on ([`Ask::may_learn`]).
        let mut waits = 0;
        let mut wait_again = true;
        loop {
            let local = match tier {
                Some((_, _, remote)) => hybrid.view.check_under_then(key, cost, remote, decided)?,
                None => hybrid.view.check_then(key, cost, decided)?,
            };
            match local {
                Local::Decided(enforced) => {
                    #[cfg(feature = "metrics")]
                    if let Some(metrics) = &self.metrics {
                        metrics.local();
                    }
                    return Ok((enforced, None));
                }
                Local::Ask(ask) if ask.is_claim() => {
                    let flight = hybrid.flights.fly(key);
                    let under = under(ask.payload());
                    return self
                        .ask(ask, key, cost, carried, under, Some(&flight))
                        .await;
                }
                Local::Ask(ask) => {
                    if !(wait_again && waits < MAX_WAITS && ask.may_learn(tier.is_some())) {
                        let under = under(ask.payload());
                        return self.ask(ask, key, cost, carried, under, None).await;
                    }
                    // An unclaimed ask holds nothing: dropped, it was never
                    // sent.
                    drop(ask);
                    waits += 1;
                    match hybrid.flights.in_flight(key) {
                        Some(flight) => {
                            wait_again = flight.wait(core.connection.call_timeout()).await;
                        }
                        // Claimed, its flight not registered yet: the
                        // claimant is between the two, on another thread.
                        None => tokio::task::yield_now().await,
                    }
                }
            }
        }
    }

    /// Sends the local half's `ask` (mode "4") under a stamp, the quota's
    /// (`under`), and installs its reply, telling the checks waiting on
    /// its `flight` (a claimed ask's) whether Redis denied: a check of
    /// `cost` units for `key`, carrying `carried` if it does.
    async fn ask(
        &self,
        ask: Ask<'_, Vec<u8>, Option<Current>>,
        key: &[u8],
        cost: u32,
        carried: Option<&Quota>,
        (quota, stamp): (Quota, Stamp),
        flight: Option<&Flight<'_>>,
    ) -> Result<(Enforced, Option<RedisReceipt>), Error> {
        let core = &self.core;
        // A client clock decides at the ask's reading (taken after the
        // view's decision, before the call).
        let now = core.time.at(ask.sent_ns());
        let redis_key = core.namespace.key(key);
        let request = *ask.request();
        let remote = *ask.quota();
        let timer = CallTimer::start();
        let sent: Result<Vec<i64>, _> = evaluate(&core.connection, &core.script, |name, body| {
            let mut command = redis::cmd(name);
            command.arg(body).arg(1).arg(&redis_key);
            lease_arguments(&mut command, &now, &remote, &request, core.grace_ms, &stamp);
            command
        })
        .await;
        self.count(&sent, &timer);
        let burst = stamp.limit.burst;
        match sent {
            Ok(replies) => {
                let reply = lease_reply(&replies, &request)?;
                ask.complete(&reply);
                if let Some(flight) = flight {
                    // Redis's answer, not a failure policy's: only a denial
                    // of Redis's is worth waiting on the next reply for.
                    flight.answered(reply.allowed);
                }
                // The units this instance may admit now: its lease's, and
                // those still free on Redis.
                let remaining = reply.remaining.saturating_add(reply.granted);
                let counts = Counts {
                    allowed: reply.allowed,
                    remaining: remaining.min(burst),
                    retry_us: reply.retry_us,
                    reset_us: reply.reset_us,
                };
                counts
                    .decision(burst, &now)
                    .map(|decision| (by_quota(decision, quota), None))
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
                Ok((
                    self.fall_back(key, cost, false, burst, carried, cause)?,
                    None,
                ))
            }
            Err(failed) => Err(failed.into()),
        }
    }

    /// Decides on Redis (modes "0", "1" and "5") under `stamp`, the quota
    /// `quota`'s (`carried`, when a check carries its own); with a receipt
    /// for an admission, if `op` asks for one.
    #[allow(clippy::too_many_arguments)]
    async fn on_redis(
        &self,
        key: &[u8],
        cost: u32,
        op: Op,
        now: Now,
        stamp: &Stamp,
        quota: Quota,
        carried: Option<&Quota>,
    ) -> Result<(Enforced, Option<RedisReceipt>), Error> {
        let core = &self.core;
        let redis_key = core.namespace.key(key);
        let entry = core.entry(redis_key, cost, &now, *stamp);
        let call = Call::new(op, std::slice::from_ref(&entry));
        let timer = CallTimer::start();
        let sent: Result<Replied, _> = call.send(&core.connection, &core.script).await;
        self.count(&sent, &timer);
        let burst = stamp.limit.burst;
        match sent {
            Ok(Replied { integers, given }) => {
                let decided = decision(&integers, burst, &now)?;
                let receipt = given
                    .filter(|_| decided.is_allowed())
                    .map(|(written, previous)| {
                        RedisReceipt::new(
                            &core.connection,
                            &core.script,
                            &core.refunds,
                            entry.key,
                            A::CODE == "l",
                            written,
                            previous,
                        )
                    });
                Ok((by_quota(decided, quota), receipt))
            }
            Err(CallError::Unavailable(cause)) => {
                let peek = op == Op::Peek;
                Ok((
                    self.fall_back(key, cost, peek, burst, carried, cause)?,
                    None,
                ))
            }
            Err(failed) => Err(failed.into()),
        }
    }

    /// Counts a call that was attempted (not one the breaker kept back),
    /// and for metrics, its outcome and time.
    fn count<T>(&self, sent: &Result<T, CallError>, timer: &CallTimer) {
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            metrics.call(sent, timer.0.elapsed());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = timer;
        if !matches!(
            sent,
            Err(CallError::Unavailable(Unavailable::BreakerOpen(_)))
        ) {
            // Relaxed: a statistic, ordered with nothing.
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Returns the failure policy's answer for a check Redis did not
    /// decide, of a limit of `burst` (under `carried`, if the check
    /// carries its quota).
    fn fall_back(
        &self,
        key: &[u8],
        cost: u32,
        peek: bool,
        burst: u32,
        carried: Option<&Quota>,
        cause: Unavailable,
    ) -> Result<Enforced, Error> {
        let core = &self.core;
        let open_for = match cause {
            Unavailable::BreakerOpen(open_for) => open_for,
            _ => core.connection.breaker().admit_peek().unwrap_or_default(),
        };
        let decided = self
            .fallback
            .decide(key, cost, peek, burst, carried, open_for, cause);
        #[cfg(feature = "metrics")]
        if let (Some(metrics), Ok(_), false) = (&self.metrics, &decided, peek) {
            metrics.fallback();
        }
        decided
    }

    /// Counts a check's decision for metrics (feature `metrics`, a limiter
    /// built with [`Builder::metrics`]; otherwise nothing).
    #[cfg_attr(not(feature = "metrics"), allow(clippy::unused_self))]
    fn checked<R>(
        &self,
        enforced: Result<(Enforced, R), Error>,
        cost: u32,
    ) -> Result<(Enforced, R), Error> {
        #[cfg(feature = "metrics")]
        if let (Some(metrics), Ok((enforced, _))) = (&self.metrics, &enforced) {
            metrics.check(&Ok(enforced.decision), cost);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = cost;
        enforced
    }

    /// Hands the installed `metrics` recorder what this limiter counted
    /// since the last call (feature `metrics`, a limiter built with
    /// [`Builder::metrics`]; see the table below for the names). Call it
    /// where the exporter is scraped, or on a timer.
    ///
    /// | metric | kind | labels |
    /// |---|---|---|
    /// | `tollgate_checks_total` | counter | `limiter`, `outcome` (`admitted`, `denied`) |
    /// | `tollgate_units_total` | counter | `limiter`, `outcome`: the checks' costs |
    /// | `tollgate_redis_local_decisions_total` | counter | `limiter`: checks the local half decided (a [`Mode`](crate::Mode) other than `Exact`) |
    /// | `tollgate_redis_calls_total` | counter | `limiter`: script calls checks and peeks sent (round trips) |
    /// | `tollgate_redis_round_trip_seconds` | histogram | `limiter`: each call's time to its answer (or to its failure) |
    /// | `tollgate_redis_errors_total` | counter | `limiter`, `kind` (`timeout`, `connection`, `script`, `breaker_open`: a call the breaker kept back) |
    /// | `tollgate_redis_fallback_decisions_total` | counter | `limiter`: decisions the failure policy made in Redis's place |
    /// | `tollgate_redis_breaker_open` | gauge | `limiter`: 1 while the connection's breaker is open or half-open, else 0 |
    /// | `tollgate_redis_breaker_transitions_total` | counter | `limiter`, `to` (`open`, `closed`) |
    ///
    /// Counted: checks (`check`, `check_n`, `check_with`, their `_enforced`
    /// forms, and so the layer's rules), each decision they return, the
    /// failure policy's included (also counted apart). Not counted: peeks (but their calls
    /// are), reservations, refunds and [`check_all`](crate::check_all). The
    /// checks are counted per thread, as the in-process limiters count, so that
    /// a check the local half decides writes nothing another thread writes;
    /// the rest is counted where a round trip or a failure already is. The
    /// breaker belongs to the connection: limiters sharing one report its
    /// state and transitions each under their own name. The round-trip
    /// histogram alone is recorded as each call ends, through the recorder
    /// installed then (the global one); everything else when published.
    #[cfg(feature = "metrics")]
    pub fn publish_metrics(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.publish(
                self.calls.load(Ordering::Relaxed),
                self.core.connection.breaker(),
            );
        }
    }
}

/// When a call began, for its round-trip time (feature `metrics`; else
/// nothing).
struct CallTimer(#[cfg(feature = "metrics")] std::time::Instant);

impl CallTimer {
    fn start() -> Self {
        Self(
            #[cfg(feature = "metrics")]
            std::time::Instant::now(),
        )
    }
}

/// Marks `decision` as made by `quota` (by Redis, or from what Redis told
/// this instance).
/// The quota of `limit` as the local half decides it (GCRA's interval and
/// burst).
fn remote_quota(limit: &ScriptLimit) -> Result<RemoteQuota, ConfigError> {
    RemoteQuota::new(limit.span_us, limit.burst).map_err(ConfigError::Local)
}

fn by_quota(decision: Decision, quota: Quota) -> Enforced {
    Enforced {
        decision,
        quota: Some(quota),
    }
}

/// Whether `quota` (whose script limit is `limit`) counts in the windows
/// of the limiter's quota `current`, for a window algorithm: its counts
/// mean nothing in windows of another length, which the script refuses.
fn same_window<A: Scripted>(
    current: &Current,
    quota: &Quota,
    limit: &ScriptLimit,
) -> Result<(), LayoutError> {
    if A::BY_INTERVAL || limit.span_us == current.stamp.limit.span_us {
        Ok(())
    } else {
        Err(LayoutError::WindowDiffers {
            limiter: current.quota.burst_window(),
            quota: quota.burst_window(),
        })
    }
}

impl Core {
    /// Returns this limiter's part of a call: `cost` units for the Redis
    /// key `key` at `now`, under `stamp`.
    fn entry<'a>(&self, key: Vec<u8>, cost: u32, now: &'a Now, stamp: Stamp) -> Entry<'a> {
        Entry {
            key,
            stamp,
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
            .field("quota", &self.core.quota.load())
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
                    |local| local.mode.bound(&self.core.quota.load().stamp.limit),
                ),
            )
            .field("connection", &self.core.connection)
            .finish_non_exhaustive()
    }
}
