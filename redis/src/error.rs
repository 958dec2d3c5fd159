//! What a check or a configuration can fail with.

use tollgate::CheckError;
use tollgate::wait::WaitError;

use crate::connection::CallError;

/// A limiter that cannot be built, naming the bad setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key prefix or hash tag holds `{` or `}` (which would let it
    /// choose a Redis Cluster slot for every key under it), or the hash tag
    /// is empty (which Redis Cluster ignores).
    #[error("the {setting} must hold no '{{' or '}}' (and a tag at least one byte): {value:?}")]
    BadKeyPart {
        /// `"key prefix"` or `"hash tag"`.
        setting: &'static str,
        /// The rejected value.
        value: String,
    },
    /// [`OnFailure::Local`](crate::OnFailure::Local) divides the quota
    /// into shares too small to admit anything.
    #[error(
        "a share of 1/{instances} of a limit of {limit} with a burst of {burst} admits nothing"
    )]
    ShareTooSmall {
        /// The instances sharing the quota.
        instances: u32,
        /// The quota's limit.
        limit: u32,
        /// The quota's burst.
        burst: u32,
    },
    /// The local share's quota is invalid.
    #[error("the local share's quota: {0}")]
    LocalQuota(tollgate::QuotaError),
    /// The quota's spans do not fit the script's exact arithmetic: Lua
    /// numbers are doubles, exact only below 2^53, so every span is held to
    /// 2^51 µs (about 71 years) and, for the sliding window counter, the
    /// burst plus one times the window to 2^52 µs.
    #[error(
        "the quota's {what} is {value} µs, above the {limit} µs the script's \
         double-precision arithmetic holds exactly"
    )]
    QuotaTooLarge {
        /// Which number is too large.
        what: &'static str,
        /// Its value in microseconds.
        value: u64,
        /// The most it may be.
        limit: u64,
    },
    /// A [`Mode`](crate::Mode) other than `Exact` for an algorithm other
    /// than GCRA: only GCRA's local knowledge stays true.
    #[error("deciding locally (deny cache, leases) needs GCRA")]
    ModeNeedsGcra,
    /// The local half's configuration (the leases' slack too long).
    #[error("the local half: {0}")]
    Local(tollgate::remote::RemoteError),
    /// A [`Mode`](crate::Mode) other than `Exact` on a Redis Cluster with
    /// the server's clock, and no declared skew between the masters'
    /// clocks ([`Builder::cluster_clock_skew`](crate::Builder::cluster_clock_skew)).
    #[error(
        "deciding locally on a Cluster with the servers' clocks needs the most they differ \
         (cluster_clock_skew), or a client clock"
    )]
    ClusterSkewUnknown,
    /// The quota cannot change as asked: a window algorithm and a quota of
    /// another window (its counts mean nothing in other windows), a
    /// strategy the script does not implement, or the in-process fallback
    /// share's own refusal.
    #[error(transparent)]
    Change(#[from] tollgate::store::ChangeError),
    /// The quota's revision is at its largest (2^32 − 1): it cannot change
    /// again.
    #[error("the quota's revision cannot be raised again")]
    RevisionsExhausted,
}

/// A check that returned no decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cost is invalid (zero, or above the burst): the same errors as
    /// the in-process limiters, found before any round trip.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// Redis did not decide (unreachable, timed out, refused, or behind an
    /// open circuit breaker) and the failure policy is
    /// [`OnFailure::Error`](crate::OnFailure::Error).
    #[error("redis unavailable: {0}")]
    Unavailable(crate::failure::Unavailable),
    /// Limits checked together ([`check_all`](crate::check_all)) that do
    /// not share one hash tag (Redis Cluster could not decide them in one
    /// script) or one [`Connection`](crate::Connection) (they may live on
    /// different servers).
    #[error("limits checked together must share one hash tag and one connection")]
    Apart,
    /// Two requests of one [`check_all`](crate::check_all) name the same
    /// key of the same limiter; ask once with the summed cost.
    #[error("one limiter's key appears twice among limits checked together")]
    SameKeyTwice,
    /// The script failed on the server (keys in the limiter's namespace
    /// written by something else, or a server that cannot run it).
    #[error("the rate-limit script failed: {0}")]
    Script(redis::RedisError),
    /// A reservation's slot is further than the most the caller would wait
    /// ([`RedisLimiter::reserve_n`](crate::RedisLimiter::reserve_n)):
    /// [`WaitError::TooLong`], the in-process limiters' error. Nothing was
    /// reserved. (An invalid cost is [`Error::Check`], as for a check.)
    #[error(transparent)]
    Wait(WaitError),
    /// The quota a check carries cannot be decided
    /// ([`RedisLimiter::check_with`](crate::RedisLimiter::check_with)):
    /// [`ConfigError::QuotaTooLarge`] for one the script cannot hold (or,
    /// on a limiter deciding locally, [`ConfigError::Local`] for one the
    /// local half cannot).
    #[error("the quota the check carries: {0}")]
    Quota(ConfigError),
    /// The script's reply was not a well-formed decision (a bug, or keys in
    /// the limiter's namespace written by something else).
    #[error("malformed reply from the rate-limit script: {0}")]
    Reply(String),
}

/// Sorts a call Redis did not answer with a value: unavailable (the
/// failure policy's to answer, where there is one), or failed.
impl From<CallError> for Error {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Unavailable(cause) => Error::Unavailable(cause),
            CallError::Failed(error) => Error::Script(error),
        }
    }
}
