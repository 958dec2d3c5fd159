//! The limiter: the contract of [`tollgate`]'s limiters, decided by Redis.

use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::ErrorKind;
use tollgate::algorithm::{Gcra, validate_cost};
use tollgate::clock::Clock;
use tollgate::remote::{Local, RemoteClock, RemoteQuota};
use tollgate::{Decision, Quota};

use crate::connection::{Call as Sent, Connection};
use crate::error::{ConfigError, Error};
use crate::failure::{Admission, Enforced, Fallback, OnFailure, Unavailable};
use crate::key::Namespace;
use crate::local::{BootClock, Hybrid, Mode, lease_arguments, lease_reply};
use crate::script::{END_OF_TIME_US, MAX_SPAN_US, SCRIPT, ScriptLimit, Scripted};

/// The longest expiry grace, 2^40 ms (34 years): every expiry stays an
/// exact integer in the script.
const MAX_GRACE_MS: u64 = 1 << 40;

/// The most keys a limiter's local half holds by default.
const LOCAL_KEYS: NonZeroUsize = NonZeroUsize::new(100_000).expect("nonzero");

/// A rate limiter whose state lives in Redis, so that every instance of a
/// service shares one count per key.
///
/// Each check is one round trip: the script (all five algorithms, see
/// [`SCRIPT`]) is called by its SHA-1 with `EVALSHA`, and sent whole with
/// `EVAL` only when the server answers that it does not know it (after a
/// restart or `SCRIPT FLUSH`); no error reaches the caller for that.
///
/// # Exact to the microsecond
///
/// The script decides in integer microseconds (Lua numbers are doubles,
/// exact below 2^53: nanoseconds since 1970 do not fit, microseconds do).
/// The quota's interval or window is rounded **up** to a whole microsecond
/// and a client time **down**, so the limiter never admits more than the
/// quota; `retry_after` is actionable (a retry after it succeeds). With the
/// server's clock (the default) waits are whole microseconds; with a client
/// clock ([`RedisBuilder::clock`]) they are exact to the nanosecond against
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

/// Configures a [`RedisLimiter`]; see [`RedisLimiter::builder`].
pub struct RedisBuilder<A: Scripted = Gcra> {
    name: String,
    quota: Quota,
    prefix: String,
    tag: Option<String>,
    time: Time,
    grace: Duration,
    script: Option<String>,
    on_failure: OnFailure,
    mode: Mode,
    local_keys: NonZeroUsize,
    cluster_skew: Option<Duration>,
    _algorithm: PhantomData<fn() -> A>,
}

/// Where a check's "now" comes from.
#[derive(Clone)]
enum Time {
    /// The server's `TIME`, read inside the script: one clock for every
    /// instance (per master, on a Cluster: a key's master decides it).
    Server,
    /// The caller's clock, in nanoseconds from its origin; and the local
    /// half deciding on it, if any, which must know every reading sent.
    Client(Arc<dyn Clock>, Option<Arc<Hybrid>>),
}

/// The script's source and SHA-1.
#[derive(Debug)]
struct Script {
    source: String,
    sha: String,
}

impl RedisLimiter<Gcra> {
    /// Starts configuring a limiter named `name` (its keys are apart from
    /// every other name's) enforcing `quota` with GCRA.
    #[must_use]
    pub fn builder(name: impl Into<String>, quota: Quota) -> RedisBuilder<Gcra> {
        RedisBuilder {
            name: name.into(),
            quota,
            prefix: "tollgate:".to_owned(),
            tag: None,
            time: Time::Server,
            grace: Duration::ZERO,
            script: None,
            on_failure: OnFailure::default(),
            mode: Mode::Exact,
            local_keys: LOCAL_KEYS,
            cluster_skew: None,
            _algorithm: PhantomData,
        }
    }
}

impl RedisBuilder<Gcra> {
    /// How much the limiter decides locally ([`Mode`]): every check on
    /// Redis (the default), denials cached exactly, or leases.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The most keys the local half holds (100 000 by default): a key
    /// beyond them is decided on Redis, uncached, until idle keys make
    /// room. Memory stays bounded whatever keys clients send.
    #[must_use]
    pub fn local_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.local_keys = max_keys;
        self
    }

    /// The most two masters' clocks differ, for a [`Mode`] other than
    /// `Exact` on a Redis Cluster with the server's clock: each master
    /// decides its keys on its own `TIME`, and the local half judges every
    /// key by a bound that must cover the master furthest ahead (notes/12).
    /// Required there ([`ConfigError::ClusterSkewUnknown`] without it);
    /// unused with a client clock ([`clock`](RedisBuilder::clock)), which
    /// every master decides on alike.
    #[must_use]
    pub fn cluster_clock_skew(mut self, skew: Duration) -> Self {
        self.cluster_skew = Some(skew);
        self
    }
}

impl<A: Scripted> RedisBuilder<A> {
    /// Another algorithm, for example
    /// [`FixedWindow`](tollgate::algorithm::FixedWindow).
    #[must_use]
    pub fn algorithm<B: Scripted>(self) -> RedisBuilder<B> {
        RedisBuilder {
            name: self.name,
            quota: self.quota,
            prefix: self.prefix,
            tag: self.tag,
            time: self.time,
            grace: self.grace,
            script: self.script,
            on_failure: self.on_failure,
            mode: self.mode,
            local_keys: self.local_keys,
            cluster_skew: self.cluster_skew,
            _algorithm: PhantomData,
        }
    }

    /// The prefix of every Redis key the limiter writes (`"tollgate:"` by
    /// default). It must hold no `{` or `}`.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Places every key of this limiter in one Redis Cluster slot, named by
    /// `tag`, so that limits sharing the tag can be checked together,
    /// atomically ([`check_all`]). Without a tag, keys are
    /// spread over the cluster by a hash of the key.
    #[must_use]
    pub fn hash_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Decides with the caller's clock instead of the server's `TIME`.
    ///
    /// Every instance must then share one clock origin and agree on the
    /// time; the key's expiry still runs on the server's clock, so the
    /// clock must not run slower than real time (a
    /// [`ManualClock`](tollgate::clock::ManualClock) left behind can see
    /// an idle key expire before it would have refilled on that clock).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.time = Time::Client(Arc::new(clock), None);
        self
    }

    /// Keeps every key `grace` longer than the instant it would decide as a
    /// fresh key (rounded up to a millisecond; at most 2^40 ms).
    ///
    /// Expiry runs on the server's clock. With a client clock that may run
    /// slower than real time (a [`ManualClock`](tollgate::clock::ManualClock)
    /// in tests, a clock that can lag the server's), a key could otherwise
    /// vanish before that clock saw it fresh, and be admitted again: a
    /// grace as long as the clock may lag prevents it, at the cost of idle
    /// keys staying that much longer. Zero by default.
    #[must_use]
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// What a check returns when Redis cannot decide it (see
    /// [`OnFailure`]); [`OnFailure::Error`] by default.
    #[must_use]
    pub fn on_failure(mut self, policy: OnFailure) -> Self {
        self.on_failure = policy;
        self
    }

    /// Replaces the script. For the tests that plant bugs in a copy of it
    /// and show that the differential tests catch them.
    #[doc(hidden)]
    #[must_use]
    pub fn script_source(mut self, source: impl Into<String>) -> Self {
        self.script = Some(source.into());
        self
    }

    /// Builds the limiter over `connection`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::BadKeyPart`] for a prefix or tag with a brace, and
    /// [`ConfigError::QuotaTooLarge`] for a quota whose spans do not fit
    /// the script's exact arithmetic, and [`ConfigError::ShareTooSmall`] for
    /// a local share that admits nothing, [`ConfigError::ModeNeedsGcra`]
    /// for a [`Mode`] chosen before another algorithm, and
    /// [`ConfigError::Local`] for leases whose slack is too long.
    pub fn build(self, connection: Connection) -> Result<RedisLimiter<A>, ConfigError> {
        let limit = ScriptLimit::new::<A>(&self.quota)?;
        let fallback = Fallback::new(self.on_failure, &self.quota)?;
        let namespace = Namespace::new(&self.prefix, &self.name, &limit, self.tag.as_deref())?;
        let source = self.script.unwrap_or_else(|| SCRIPT.to_owned());
        let sha = redis::Script::new(&source).get_hash().to_owned();
        if self.mode != Mode::Exact && A::CODE != Gcra::CODE {
            return Err(ConfigError::ModeNeedsGcra);
        }
        let local = if self.mode == Mode::Exact {
            None
        } else {
            let (clock, remote): (Arc<dyn Clock>, _) = match &self.time {
                Time::Client(clock, _) => (Arc::clone(clock), RemoteClock::Local),
                Time::Server if connection.is_cluster() => {
                    let skew = self.cluster_skew.ok_or(ConfigError::ClusterSkewUnknown)?;
                    (Arc::new(BootClock::new()), RemoteClock::Several { skew })
                }
                Time::Server => (Arc::new(BootClock::new()), RemoteClock::One),
            };
            Some(Arc::new(Hybrid::new(
                self.mode,
                RemoteQuota::new(limit.span_us, limit.burst).map_err(ConfigError::Local)?,
                clock,
                remote,
                self.local_keys,
                // A claim's call ends within the call timeout; twice it,
                // and a claim still standing was abandoned.
                connection.call_timeout().saturating_mul(2),
            )?))
        };
        // Every call on the client clock (a plain check, a reservation, a
        // refund, a multi-limit check) tells the local half its reading,
        // so that no local decision is taken at an older instant.
        let time = match self.time {
            Time::Client(clock, _) => Time::Client(clock, local.clone()),
            Time::Server => Time::Server,
        };
        Ok(RedisLimiter {
            local,
            calls: AtomicU64::new(0),
            core: Core {
                connection,
                namespace,
                limit,
                time,
                grace_ms: u64::try_from(self.grace.as_nanos().div_ceil(1_000_000))
                    .unwrap_or(u64::MAX)
                    .min(MAX_GRACE_MS),
                script: Arc::new(Script { source, sha }),
            },
            quota: self.quota,
            fallback,
        })
    }
}

impl<A: Scripted> RedisLimiter<A> {
    /// Checks one unit for `key`.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis cannot decide and the failure
    /// policy is [`OnFailure::Error`] (else the policy decides),
    /// [`Error::Script`] when the script fails, [`Error::Reply`] for a
    /// malformed answer.
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

    /// What a unit check would decide now, changing nothing and storing no
    /// key.
    ///
    /// # Errors
    ///
    /// As [`check`](RedisLimiter::check).
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<Decision, Error> {
        Ok(self.decide(key.as_ref(), 1, true).await?.decision)
    }

    /// The quota every key is held to.
    #[must_use]
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The quota's burst: the most unit requests a key admits at once.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.core.limit.burst
    }

    /// The `SCAN` pattern that matches every key this limiter writes.
    #[must_use]
    pub fn key_pattern(&self) -> Vec<u8> {
        self.core.namespace.pattern()
    }

    /// The Redis key that holds `key`'s state.
    #[must_use]
    pub fn redis_key(&self, key: impl AsRef<[u8]>) -> Vec<u8> {
        self.core.namespace.key(key.as_ref())
    }

    /// A check of `cost` units for `key` against this limiter, to be
    /// decided together with others by [`check_all`].
    #[must_use]
    pub fn request(&self, key: impl AsRef<[u8]>, cost: u32) -> Request<'_> {
        Request {
            limiter: &self.core,
            key: self.core.namespace.key(key.as_ref()),
            cost,
        }
    }

    /// Script calls this limiter's checks and peeks attempted (those that
    /// failed included, those the circuit breaker kept back not): with a
    /// [`Mode`] that decides locally, how many checks asked Redis.
    #[must_use]
    pub fn remote_calls(&self) -> u64 {
        // Relaxed: a statistic, ordered with nothing.
        self.calls.load(Ordering::Relaxed)
    }

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
            lease_arguments(&mut command, now.us, &hybrid.quota, &request, core.grace_ms);
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
                decision(
                    &[
                        i64::from(reply.allowed),
                        i64::from(remaining.min(core.limit.burst)),
                        i64::try_from(reply.retry_us).unwrap_or(i64::MAX),
                        i64::try_from(reply.reset_us).unwrap_or(i64::MAX),
                    ],
                    core.limit.burst,
                    now.fraction_ns,
                )
                .map(|decision| self.by_quota(decision))
            }
            Err(Sent::Unavailable(cause)) => {
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
            Err(Sent::Failed(error)) => Err(Error::Script(error)),
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
        let mut call = Call::new(if peek { Op::Peek } else { Op::Check });
        call.push(core.entry(core.namespace.key(key), cost, &now));
        let sent = call.send(&core.connection, &core.script).await;
        self.count(&sent);
        match sent {
            Ok(replies) => decision(&replies, core.limit.burst, now.fraction_ns)
                .map(|decision| self.by_quota(decision)),
            Err(Sent::Unavailable(cause)) => self.fall_back(key, cost, peek, cause),
            Err(Sent::Failed(error)) => Err(Error::Script(error)),
        }
    }

    /// Counts a call that was attempted (not one the breaker kept back).
    fn count(&self, sent: &Result<Vec<i64>, Sent>) {
        if !matches!(sent, Err(Sent::Unavailable(Unavailable::BreakerOpen(_)))) {
            // Relaxed: a statistic, ordered with nothing.
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `decision`, made by this limiter's quota (by Redis, or from what
    /// Redis told this instance).
    fn by_quota(&self, decision: Decision) -> Enforced {
        Enforced {
            decision,
            quota: Some(self.quota),
        }
    }

    /// The failure policy's answer for a check Redis did not decide.
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
    /// This limiter's part of a call: `cost` units for the Redis key `key`
    /// at `now`.
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

impl Time {
    /// The time argument for a call now; on the client clock, the reading
    /// is recorded with the local half first (it is about to be sent).
    fn now(&self) -> Now {
        match self {
            Time::Server => Now::SERVER,
            Time::Client(clock, local) => {
                let reading_ns = clock.now_ns();
                if let Some(local) = local {
                    local.view.record_sent(reading_ns);
                }
                Now::reading(reading_ns)
            }
        }
    }

    /// The time argument for a check whose local reading is `reading_ns`
    /// (the client clock's, when it decides).
    fn at(&self, reading_ns: u64) -> Now {
        match self {
            Time::Server => Now::SERVER,
            Time::Client(..) => Now::reading(reading_ns),
        }
    }
}

impl Now {
    /// The server's `TIME`.
    const SERVER: Now = Now {
        us: None,
        fraction_ns: 0,
    };

    /// A client clock's reading, in whole microseconds (clamped to the
    /// script's end of time) and the nanoseconds past them.
    fn reading(reading_ns: u64) -> Now {
        let now_us = reading_ns / 1_000;
        if now_us >= END_OF_TIME_US {
            Now {
                us: Some(END_OF_TIME_US),
                fraction_ns: 0,
            }
        } else {
            Now {
                us: Some(now_us),
                fraction_ns: reading_ns % 1_000,
            }
        }
    }
}

/// One limit of a request checked against several ([`check_all`]).
pub struct Request<'a> {
    limiter: &'a Core,
    key: Vec<u8>,
    cost: u32,
}

/// The decisions of several limits checked together: admitted only if
/// every limit admits, and then every limit is charged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "decisions say whether the request may proceed"]
pub struct Decisions {
    decisions: Vec<Decision>,
}

impl Decisions {
    /// Whether every limit admitted the request (and was charged).
    #[must_use]
    pub fn is_allowed(&self) -> bool {
        self.decisions.iter().all(Decision::is_allowed)
    }

    /// Each limit's decision, in the order of the requests. When the
    /// request was denied, nothing was charged anywhere, and the decisions
    /// that read as allowed say what those limits would have admitted.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// The decision a client should be told: when denied, the denial with
    /// the longest wait; when allowed, the limit with the fewest remaining.
    /// `None` only for an empty set of requests.
    #[must_use]
    pub fn binding(&self) -> Option<&Decision> {
        if self.is_allowed() {
            self.decisions
                .iter()
                .min_by_key(|decision| decision.remaining())
        } else {
            self.decisions
                .iter()
                .max_by_key(|decision| decision.retry_after())
        }
    }
}

/// Decides a request against several limits (for example per user and per
/// IP address) in one script call, all or nothing: either every limit
/// admits and each is charged its cost, or nothing is charged.
///
/// The limiters must share one hash tag ([`RedisBuilder::hash_tag`]), so
/// that Redis Cluster keeps their keys in one slot, and one [`Connection`]
/// (clones of one handle). Each limit is decided at its own limiter's time
/// (the server's, or its clock's).
///
/// # Errors
///
/// [`Error::Unavailable`] when Redis cannot decide, whatever the limiters'
/// failure policies (falling back limit by limit would not be all or
/// nothing: the caller chooses), [`Error::Apart`] when the limiters do not
/// share a hash tag and a connection, [`Error::SameKeyTwice`] when two requests name one
/// limiter's one key (charge it once with their summed cost instead),
/// [`Error::Check`] for an invalid cost (nothing is sent), and as
/// [`RedisLimiter::check`].
pub async fn check_all(requests: &[Request<'_>]) -> Result<Decisions, Error> {
    let Some(first) = requests.first() else {
        return Ok(Decisions {
            decisions: Vec::new(),
        });
    };
    let tag = first.limiter.namespace.tag();
    if tag.is_none()
        || requests.iter().any(|request| {
            request.limiter.namespace.tag() != tag
                || !request
                    .limiter
                    .connection
                    .same_as(&first.limiter.connection)
        })
    {
        return Err(Error::Apart);
    }
    for (index, request) in requests.iter().enumerate() {
        validate_cost(request.cost, request.limiter.limit.burst)?;
        // The script decides every limit against the state before the call
        // and then writes each: a key twice would be charged once for two
        // admissions.
        if requests[..index]
            .iter()
            .any(|earlier| earlier.key == request.key)
        {
            return Err(Error::SameKeyTwice);
        }
    }
    let times: Vec<Now> = requests
        .iter()
        .map(|request| request.limiter.time.now())
        .collect();
    let mut call = Call::new(Op::Check);
    for (request, now) in requests.iter().zip(&times) {
        call.push(
            request
                .limiter
                .entry(request.key.clone(), request.cost, now),
        );
    }
    let replies = match call
        .send(&first.limiter.connection, &first.limiter.script)
        .await
    {
        Ok(replies) => replies,
        Err(Sent::Unavailable(cause)) => return Err(Error::Unavailable(cause)),
        Err(Sent::Failed(error)) => return Err(Error::Script(error)),
    };
    if replies.len() != 4 * requests.len() {
        return Err(Error::Reply(format!("{replies:?}")));
    }
    let decisions = requests
        .iter()
        .zip(&times)
        .zip(replies.chunks(4))
        .map(|((request, now), reply)| {
            decision(reply, request.limiter.limit.burst, now.fraction_ns)
        })
        .collect::<Result<_, _>>()?;
    Ok(Decisions { decisions })
}

/// A check's time argument, and how far the client's reading lies past the
/// microsecond it was rounded down to (so that waits can be told from the
/// reading itself).
struct Now {
    /// Microseconds, or `None` for the server's `TIME`.
    us: Option<u64>,
    fraction_ns: u64,
}

/// What a call asks of the script.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Check,
    Peek,
    /// Reserve (one GCRA limit), waiting at most this many microseconds.
    Reserve(u64),
}

/// One call of the script: its keys and arguments, written straight into
/// the command (the `EVAL` fallback writes them again).
struct Call<'a> {
    op: Op,
    limits: Vec<Entry<'a>>,
}

/// One limit of a call.
struct Entry<'a> {
    key: Vec<u8>,
    limit: ScriptLimit,
    cost: u32,
    now: &'a Now,
    grace_ms: u64,
}

impl<'a> Call<'a> {
    fn new(op: Op) -> Self {
        Self {
            op,
            limits: Vec::new(),
        }
    }

    fn push(&mut self, limit: Entry<'a>) {
        self.limits.push(limit);
    }

    /// `EVALSHA` or `EVAL` (`name`) of `body`, with the keys and arguments.
    fn command(&self, name: &str, body: &str) -> redis::Cmd {
        let mut command = redis::cmd(name);
        command.arg(body).arg(self.limits.len());
        for limit in &self.limits {
            command.arg(&limit.key);
        }
        command.arg(match self.op {
            Op::Check => "0",
            Op::Peek => "1",
            Op::Reserve(_) => "2",
        });
        for Entry {
            limit,
            cost,
            now,
            grace_ms,
            ..
        } in &self.limits
        {
            match now.us {
                Some(us) => command.arg(us),
                None => command.arg(""),
            };
            command
                .arg(limit.code)
                .arg(cost)
                .arg(limit.span_us)
                .arg(limit.burst)
                .arg(grace_ms);
        }
        if let Op::Reserve(max_wait_us) = self.op {
            command.arg(max_wait_us);
        }
        command
    }

    /// Runs the call (see [`evaluate`]).
    async fn send(&self, connection: &Connection, script: &Script) -> Result<Vec<i64>, Sent> {
        evaluate(connection, script, |name, body| self.command(name, body)).await
    }
}

/// Runs the script with the command `command(name, body)` builds
/// (`EVALSHA` with the SHA-1, or `EVAL` with the source when the server
/// has not got it, both within one call timeout), unless the connection's
/// breaker is open, and tells the breaker how it went.
async fn evaluate(
    connection: &Connection,
    script: &Script,
    command: impl Fn(&str, &str) -> redis::Cmd,
) -> Result<Vec<i64>, Sent> {
    let breaker = connection.breaker();
    if let Admission::Skip(open_for) = breaker.admit() {
        return Err(Sent::Unavailable(Unavailable::BreakerOpen(open_for)));
    }
    let result = connection
        .within(async {
            match connection.send(&command("EVALSHA", &script.sha)).await {
                Err(error) if error.kind() == ErrorKind::NoScriptError => {
                    connection.send(&command("EVAL", &script.source)).await
                }
                other => other,
            }
        })
        .await;
    match &result {
        Ok(_) => breaker.succeeded(),
        Err(Sent::Unavailable(_)) => breaker.failed(),
        Err(Sent::Failed(_)) => {}
    }
    result
}

/// The decision in four integers of the script's reply.
fn decision(reply: &[i64], limit: u32, fraction_ns: u64) -> Result<Decision, Error> {
    let malformed = || Error::Reply(format!("{reply:?}"));
    let &[allowed, remaining, retry_us, reset_us] = reply else {
        return Err(malformed());
    };
    let remaining = u32::try_from(remaining).map_err(|_| malformed())?;
    let retry_us = u64::try_from(retry_us).map_err(|_| malformed())?;
    let reset_us = u64::try_from(reset_us).map_err(|_| malformed())?;
    if (allowed == 1) != (retry_us == 0) {
        return Err(malformed());
    }
    // The client's reading lay `fraction_ns` past the microsecond decided
    // on, so an instant `us` later on that grid is `us × 1000 − fraction`
    // from the reading. A denial waits at least 1 µs: it stays positive.
    let from_reading =
        |us: u64| Duration::from_nanos(us.saturating_mul(1_000).saturating_sub(fraction_ns));
    Decision::from_parts(
        limit,
        remaining,
        from_reading(retry_us),
        from_reading(reset_us),
    )
    .ok_or_else(malformed)
}

impl RedisLimiter<Gcra> {
    /// Reserves `cost` units for `key` at the earliest slot after every
    /// reservation already made on it, by any instance, if that slot is at
    /// most `max_wait` away (notes/11): one round trip, in which the script
    /// admits the request now for its future slot. Reservations of one key
    /// are served in the order Redis runs them, whichever instance made
    /// them.
    ///
    /// # Errors
    ///
    /// [`Error::TooLong`] when the slot is further than `max_wait`
    /// (nothing is reserved), [`Error::Check`] for a cost of zero or above
    /// the burst, and [`Error::Unavailable`] when Redis cannot answer,
    /// whatever the failure policy (a reservation is Redis's or none).
    pub async fn reserve_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        max_wait: Duration,
    ) -> Result<RedisReservation, Error> {
        let core = &self.core;
        validate_cost(cost, core.limit.burst)?;
        let tolerance_us = u64::from(core.limit.burst) * core.limit.span_us;
        // Whole microseconds, rounded down: never longer than asked.
        let max_wait_us = u64::try_from(max_wait.as_micros())
            .unwrap_or(u64::MAX)
            .min(MAX_SPAN_US.saturating_sub(tolerance_us));
        let now = core.time.now();
        let redis_key = core.namespace.key(key.as_ref());
        let mut call = Call::new(Op::Reserve(max_wait_us));
        call.push(core.entry(redis_key.clone(), cost, &now));
        let reply = match call.send(&core.connection, &core.script).await {
            Ok(reply) => reply,
            Err(Sent::Unavailable(cause)) => return Err(Error::Unavailable(cause)),
            Err(Sent::Failed(error)) => return Err(Error::Script(error)),
        };
        let malformed = || Error::Reply(format!("{reply:?}"));
        let &[allowed, remaining, retry_us, reset_us, tat_us] = &reply[..] else {
            return Err(malformed());
        };
        let (Ok(remaining), Ok(retry_us), Ok(reset_us), Ok(tat_us)) = (
            u32::try_from(remaining),
            u64::try_from(retry_us),
            u64::try_from(reset_us),
            u64::try_from(tat_us),
        ) else {
            return Err(malformed());
        };
        let from_reading = |us: u64| {
            Duration::from_nanos(us.saturating_mul(1_000).saturating_sub(now.fraction_ns))
        };
        if allowed != 1 {
            return Err(Error::TooLong {
                wait: from_reading(retry_us.saturating_add(max_wait_us)),
                max_wait,
            });
        }
        let wait_us = reset_us.saturating_sub(tolerance_us);
        // At its slot the key owes exactly the tolerance; admitted at once,
        // what the script said.
        let decision = if wait_us > 0 {
            Decision::from_parts(
                core.limit.burst,
                0,
                Duration::ZERO,
                from_reading(tolerance_us),
            )
        } else {
            Decision::from_parts(
                core.limit.burst,
                remaining,
                Duration::ZERO,
                from_reading(reset_us),
            )
        }
        .ok_or_else(malformed)?;
        Ok(RedisReservation {
            refund: Some(Refund {
                connection: core.connection.clone(),
                script: Arc::clone(&core.script),
                time: core.time.clone(),
                key: redis_key,
                written_us: tat_us,
                restored_us: tat_us.saturating_sub(u64::from(cost) * core.limit.span_us),
                tolerance_us,
            })
            .filter(|_| wait_us > 0),
            deadline: tokio::time::Instant::now() + from_reading(wait_us),
            delay: from_reading(wait_us),
            decision,
        })
    }

    /// Waits until one unit for `key` is admitted: [`reserve_n`](RedisLimiter::reserve_n)
    /// and a sleep until exactly the slot. Dropping the future before the
    /// slot gives the reservation back if no one reserved after it.
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](RedisLimiter::reserve_n), at once.
    pub async fn until_ready(
        &self,
        key: impl AsRef<[u8]>,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        self.until_n_ready(key, 1, max_wait).await
    }

    /// Waits until `cost` units for `key` are admitted, as
    /// [`until_ready`](RedisLimiter::until_ready).
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](RedisLimiter::reserve_n), at once.
    pub async fn until_n_ready(
        &self,
        key: impl AsRef<[u8]>,
        cost: u32,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let mut reservation = self.reserve_n(key, cost, max_wait).await?;
        reservation.ready().await;
        Ok(reservation.decision())
    }
}

/// A reservation of a future admission in Redis ([`RedisLimiter::reserve_n`]).
///
/// Dropped before its slot, it is given back (in a task spawned on the
/// current tokio runtime) if no one has reserved or been admitted on the
/// key since, and kept otherwise: moving the slots of reservations made
/// after it, possibly by other instances, would need to tell their waiters
/// (notes/11). [`cancel`](RedisReservation::cancel) gives it back now and
/// says whether it could. Refunds use `SET … KEEPTTL`: Redis 6.0 or later.
///
/// What is not given back: a reservation whose round trip was cut short
/// (the `reserve_n` future dropped while the script ran, or a call
/// timeout: the script may have reserved, and no one holds the slot; its
/// units are lost, never over-admitted), and one dropped outside a tokio
/// runtime, or on a runtime that stops before the spawned refund runs.
/// The slot is waited for on this process's timer, counted from the
/// reply's arrival: with tokio's clock paused, or a client clock that runs
/// slower than tokio's, `ready` can return before the deciding clock
/// reaches the slot.
#[must_use = "dropping a reservation before its slot gives it back"]
#[derive(Debug)]
pub struct RedisReservation {
    /// What gives it back; `None` once due, admitted at once, or given back.
    refund: Option<Refund>,
    deadline: tokio::time::Instant,
    delay: Duration,
    decision: Decision,
}

/// Everything a refund needs, owned, so that a dropped reservation can
/// send it from a task of its own.
struct Refund {
    connection: Connection,
    script: Arc<Script>,
    time: Time,
    key: Vec<u8>,
    written_us: u64,
    restored_us: u64,
    tolerance_us: u64,
}

impl Refund {
    /// Restores the TAT if the key still holds the one this reservation
    /// wrote and its slot has not come (the script judges both).
    async fn send(self) -> Result<bool, Error> {
        let now = self.time.now();
        let reply = evaluate(&self.connection, &self.script, |name, body| {
            let mut command = redis::cmd(name);
            command
                .arg(body)
                .arg(1)
                .arg(&self.key)
                .arg("3")
                .arg(self.written_us)
                .arg(self.restored_us);
            match now.us {
                Some(us) => command.arg(us),
                None => command.arg(""),
            };
            command.arg(self.tolerance_us);
            command
        })
        .await;
        match reply {
            Ok(reply) => Ok(reply == [1]),
            Err(Sent::Unavailable(cause)) => Err(Error::Unavailable(cause)),
            Err(Sent::Failed(error)) => Err(Error::Script(error)),
        }
    }
}

impl std::fmt::Debug for Refund {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refund")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("written_us", &self.written_us)
            .finish_non_exhaustive()
    }
}

impl RedisReservation {
    /// How long until the slot, on this process's timer (zero when due).
    #[must_use]
    pub fn wait(&self) -> Duration {
        self.deadline
            .saturating_duration_since(tokio::time::Instant::now())
    }

    /// The decision the units are admitted with.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// How far the slot was from the clock reading the reservation was
    /// decided at: exact, where [`wait`](RedisReservation::wait) counts
    /// down on this process's timer from when the reply arrived.
    #[must_use]
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Sleeps until the slot: the units are then admitted.
    pub async fn ready(&mut self) {
        tokio::time::sleep_until(self.deadline).await;
        self.refund = None;
    }

    /// Gives the reservation back now, if no one has reserved or been
    /// admitted on the key since and its slot has not come; returns
    /// whether it did.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis cannot answer in time: the refund
    /// may or may not have run.
    pub async fn cancel(mut self) -> Result<bool, Error> {
        match self.refund.take() {
            Some(refund) => refund.send().await,
            None => Ok(false),
        }
    }
}

impl Drop for RedisReservation {
    fn drop(&mut self) {
        let Some(refund) = self.refund.take() else {
            return;
        };
        if self.deadline <= tokio::time::Instant::now() {
            return;
        }
        // Outside a runtime nothing can be sent: the reservation is kept.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(refund.send());
        }
    }
}

impl<A: Scripted> std::fmt::Debug for RedisLimiter<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("algorithm", &std::any::type_name::<A>())
            .field("namespace", &self.core.namespace)
            .field("limit", &self.core.limit)
            .field(
                "time",
                &match self.core.time {
                    Time::Server => "server TIME",
                    Time::Client(..) => "client clock",
                },
            )
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

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl<A: Scripted> std::fmt::Debug for RedisBuilder<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("prefix", &self.prefix)
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}
