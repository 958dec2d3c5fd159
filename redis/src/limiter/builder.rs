//! [`Builder`]: a [`RedisLimiter`]'s configuration, checked once when it is
//! built.

use std::marker::PhantomData;
use std::num::NonZeroUsize;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate::Quota;
use tollgate::algorithm::{Carry, Gcra};
use tollgate::clock::Clock;
use tollgate::remote::{RemoteClock, RemoteQuota};
use tollgate::store::ChangeError;

use super::time::Time;
use super::wire::{Script, Stamp, carry_code};
use super::{Core, Current, RedisLimiter};
use crate::connection::Connection;
use crate::error::ConfigError;
use crate::failure::{Fallback, OnFailure};
use crate::key::Namespace;
use crate::local::{BootClock, Hybrid, Mode};
use crate::script::{SCRIPT, ScriptLimit, Scripted};

/// The longest expiry grace, 2^40 ms (34 years): every expiry stays an
/// exact integer in the script.
const MAX_GRACE_MS: u64 = 1 << 40;

/// The expiry grace of a limiter on a client clock unless it sets its own,
/// beyond its connection's call timeout (how long a call's reading can be
/// in flight): a reading can reach the server behind an earlier write's (a
/// clock stepped back, skew between instances, a call delayed in flight),
/// and a key must outlive that.
const CLIENT_CLOCK_GRACE: Duration = Duration::from_secs(1);

/// The most keys a limiter's local half holds by default.
const LOCAL_KEYS: NonZeroUsize = NonZeroUsize::new(100_000).expect("nonzero");

/// Configures a [`RedisLimiter`]; see [`RedisLimiter::builder`].
pub struct Builder<A: Scripted = Gcra> {
    name: String,
    quota: Quota,
    prefix: String,
    tag: Option<String>,
    time: Time,
    /// `None`: the default (`CLIENT_CLOCK_GRACE` on a client clock, none on
    /// the server's).
    grace: Option<Duration>,
    script: Option<String>,
    on_failure: OnFailure,
    mode: Mode,
    local_keys: NonZeroUsize,
    cluster_skew: Option<Duration>,
    revision: u32,
    carry: Carry,
    #[cfg(feature = "metrics")]
    metrics: bool,
    _algorithm: PhantomData<fn() -> A>,
}

impl RedisLimiter<Gcra> {
    /// Starts configuring a limiter named `name` (its keys are apart from
    /// every other name's) enforcing `quota` with GCRA. The name and the
    /// algorithm place the keys, not the quota: two limiters of one name and
    /// algorithm share their keys whatever their quotas (the instances of a
    /// service, a quota changed at runtime), so give each limit a name of its
    /// own.
    #[must_use]
    pub fn builder(name: impl Into<String>, quota: Quota) -> Builder<Gcra> {
        Builder {
            name: name.into(),
            quota,
            prefix: "tollgate:".to_owned(),
            tag: None,
            time: Time::Server,
            grace: None,
            script: None,
            on_failure: OnFailure::default(),
            mode: Mode::Exact,
            local_keys: LOCAL_KEYS,
            cluster_skew: None,
            revision: 0,
            carry: Carry::AsIs,
            #[cfg(feature = "metrics")]
            metrics: false,
            _algorithm: PhantomData,
        }
    }
}

impl Builder<Gcra> {
    /// Sets how much the limiter decides locally ([`Mode`]): every check
    /// on Redis (the default), denials cached exactly, or leases.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the most keys the local half holds (100 000 by default): a key
    /// beyond them is decided on Redis, uncached, until idle keys make
    /// room. Memory stays bounded whatever keys clients send.
    #[must_use]
    pub fn local_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.local_keys = max_keys;
        self
    }

    /// Declares the most two masters' clocks differ, for a [`Mode`] other
    /// than `Exact` on a Redis Cluster with the server's clock: each master
    /// decides its keys on its own `TIME`, and the local half judges every
    /// key by a bound that must cover the master furthest ahead. Required
    /// there ([`ConfigError::ClusterSkewUnknown`] without it); unused with
    /// a client clock ([`clock`](Builder::clock)), which every master
    /// decides on alike.
    #[must_use]
    pub fn cluster_clock_skew(mut self, skew: Duration) -> Self {
        self.cluster_skew = Some(skew);
        self
    }
}

impl<A: Scripted> Builder<A> {
    /// Switches to another algorithm, for example
    /// [`FixedWindow`](tollgate::algorithm::FixedWindow).
    #[must_use]
    pub fn algorithm<B: Scripted>(self) -> Builder<B> {
        Builder {
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
            revision: self.revision,
            carry: self.carry,
            #[cfg(feature = "metrics")]
            metrics: self.metrics,
            _algorithm: PhantomData,
        }
    }

    /// Counts the limiter's checks, round trips, errors, failure-policy
    /// decisions and breaker transitions for the `metrics` facade, under
    /// the label `limiter="<name>"` (feature `metrics`; the names are
    /// listed on [`RedisLimiter::publish_metrics`]).
    #[cfg(feature = "metrics")]
    #[must_use]
    pub fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// Declares the quota's revision (0 by default) and how a key stamped
    /// by an earlier revision is carried over to it (as is by default):
    /// what an instance started after a quota change says, so that it
    /// carries keys over as the instances changed at runtime do
    /// ([`RedisLimiter::set_quota`] explains stamps and revisions). The
    /// instances sharing keys must agree on each revision's quota.
    #[must_use]
    pub fn revision(mut self, revision: u32, carry: Carry) -> Self {
        self.revision = revision;
        self.carry = carry;
        self
    }

    /// Sets the prefix of every Redis key the limiter writes
    /// (`"tollgate:"` by default). It must hold no `{` or `}`.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Places every key of this limiter in one Redis Cluster slot, named by
    /// `tag`, so that limits sharing the tag can be checked together,
    /// atomically ([`check_all`](crate::check_all)). Without a tag, keys
    /// are spread over the cluster by a hash of the key.
    #[must_use]
    pub fn hash_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Decides with the caller's clock instead of the server's `TIME`.
    ///
    /// Every instance must then share one clock origin and agree on the
    /// time. A key's expiry still runs on the server's clock, from the
    /// reading of the call that wrote it: a later reading that reaches the
    /// server further behind (the clock stepped back, another instance's
    /// clock behind, a call delayed in flight) could find the key gone
    /// before that clock saw it fresh, and be admitted again. Keys are
    /// therefore kept a second plus the connection's call timeout longer
    /// than the instant they decide as fresh, unless
    /// [`expiry_grace`](Builder::expiry_grace) says otherwise; the clock
    /// must not fall further behind than that (a
    /// [`ManualClock`](tollgate::clock::ManualClock) or a paused
    /// `TokioClock` left behind real time can, and so can a clock stepped
    /// back further).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.time = Time::Client(Arc::new(clock), None);
        self
    }

    /// Keeps every key `grace` longer than the instant it would decide as a
    /// fresh key (rounded up to a millisecond; at most 2^40 ms).
    ///
    /// Expiry runs on the server's clock. With a client clock
    /// ([`clock`](Builder::clock)), a reading can reach the server behind
    /// the reading that wrote a key (a clock stepped back or lagging, skew
    /// between instances, a call delayed in flight), and the key could
    /// otherwise vanish before that clock saw it fresh, and be admitted
    /// again: a grace as long as a reading may fall behind prevents it, at
    /// the cost of idle keys staying that much longer. By default on a
    /// client clock, one second plus the connection's call timeout (a
    /// call's reading is in flight up to that long); none on the server's
    /// `TIME`, which each call reads where it runs.
    #[must_use]
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }

    /// Sets what a check returns when Redis cannot decide it (see
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
        let carry = carry_code(self.carry).ok_or(ChangeError::Unsupported)?;
        let fallback = Fallback::new(self.on_failure, &self.quota)?;
        let namespace = Namespace::new(&self.prefix, &self.name, A::CODE, self.tag.as_deref())?;
        let source = self.script.unwrap_or_else(|| SCRIPT.to_owned());
        let sha = redis::Script::new(&source).get_hash().to_owned();
        if self.mode != Mode::Exact && A::CODE != Gcra::CODE {
            return Err(ConfigError::ModeNeedsGcra);
        }
        let current = Current {
            quota: self.quota,
            stamp: Stamp {
                limit,
                revision: self.revision,
                carry,
            },
        };
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
                current,
                clock,
                remote,
                self.local_keys,
                // A claim's call ends within the call timeout; twice it,
                // and a claim still standing was abandoned.
                connection.call_timeout().saturating_mul(2),
            )?))
        };
        let grace = self.grace.unwrap_or(match self.time {
            Time::Client(..) => CLIENT_CLOCK_GRACE.saturating_add(connection.call_timeout()),
            Time::Server => Duration::ZERO,
        });
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
                quota: ArcSwap::from_pointee(current),
                time,
                grace_ms: u64::try_from(grace.as_nanos().div_ceil(1_000_000))
                    .unwrap_or(u64::MAX)
                    .min(MAX_GRACE_MS),
                script: Arc::new(Script { source, sha }),
                refunds: Arc::default(),
            },
            fallback,
            changing: Mutex::new(()),
            #[cfg(feature = "metrics")]
            metrics: self
                .metrics
                .then(|| crate::metrics::Metrics::new(&self.name)),
        })
    }
}

impl<A: Scripted> std::fmt::Debug for Builder<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("prefix", &self.prefix)
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}
