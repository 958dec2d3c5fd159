//! Error types: every bad input is one of these, never a panic.

use std::time::Duration;

/// A [`Quota`](crate::Quota) that cannot be built, naming the bad field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit (requests per window) was zero.
    #[error("quota limit must be at least 1 request per window, got 0")]
    ZeroLimit,
    /// The window was zero.
    #[error("quota window must be longer than zero")]
    ZeroWindow,
    /// The burst was zero: no request could ever be admitted.
    #[error("quota burst must be at least 1, got 0")]
    ZeroBurst,
    /// `limit` requests per `window` leaves less than one nanosecond between
    /// requests, below the resolution every clock here counts in.
    #[error(
        "quota of {limit} per {window:?} has an emission interval under 1 ns; \
         the most a window of {window:?} can hold is {} requests",
        window.as_nanos()
    )]
    EmissionIntervalTooShort {
        /// The requested limit.
        limit: u32,
        /// The requested window.
        window: Duration,
    },
    /// The window is longer than 2^62 ns (about 146 years), the longest span
    /// the algorithms' 64-bit arithmetic leaves room for.
    #[error("quota window {window:?} exceeds 2^62 ns (about 146 years)")]
    WindowTooLong {
        /// The requested window.
        window: Duration,
    },
    /// `burst` emission intervals (a drained key's refill time) exceed 2^62
    /// ns (about 146 years).
    #[error(
        "quota burst {burst} times the emission interval {emission_interval:?} \
         exceeds 2^62 ns (about 146 years)"
    )]
    BurstTooLarge {
        /// The requested burst.
        burst: u32,
        /// The quota's emission interval.
        emission_interval: Duration,
    },
}

/// A quota that a limiter cannot decide by on the states it keeps
/// ([`RateLimiter::check_with`](crate::RateLimiter::check_with),
/// [`Algorithm::for_quota`](crate::algorithm::Algorithm::for_quota)):
/// one store holds keys checked under different quotas only where their
/// states mean the same thing under each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// The window algorithms count in aligned windows of
    /// [`Quota::burst_window`](crate::Quota::burst_window): a count kept in
    /// one window length means nothing in another.
    #[error(
        "the limiter counts in windows of {limiter:?}; a quota whose burst window is \
         {quota:?} cannot read its counts"
    )]
    WindowDiffers {
        /// The limiter's burst window.
        limiter: Duration,
        /// The quota's.
        quota: Duration,
    },
    /// The limiter packs each key's counts into one word with room for
    /// counts up to `max` (the sliding window counter's lock-free form);
    /// the quota's burst needs more.
    #[error("the limiter packs counts up to {max} into one word; a burst of {burst} does not fit")]
    BurstDoesNotPack {
        /// The quota's burst.
        burst: u32,
        /// The largest count the limiter's word holds.
        max: u32,
    },
    /// The algorithm decides by one quota only: it does not implement
    /// [`Algorithm::for_quota`](crate::algorithm::Algorithm::for_quota).
    #[error("the limiter's algorithm decides by its own quota only")]
    Unsupported,
}

/// A check that could not be decided: the cost itself is invalid, or a new
/// key cannot be stored.
///
/// A denial is not an error: it is a [`Decision`](crate::Decision) whose
/// [`is_allowed`](crate::Decision::is_allowed) is false and which says when to
/// retry. This type is for requests the limiter refuses to decide: a cost
/// no amount of waiting would admit, a new key past the key cap, or a new
/// key the store cannot hold while a check stalled inside it holds back
/// reclamation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// A cost of zero was asked for. It is rejected rather than treated as a
    /// free pass; use [`peek`](crate::RateLimiter::peek) to look without
    /// consuming.
    #[error("a check must cost at least 1; use peek() to look without consuming")]
    ZeroCost,
    /// The key is new, the store already holds its
    /// [`max_keys`](crate::Builder::max_keys) and none of the keys it examined
    /// was idle; the cap's policy is [`WhenFull::Reject`](crate::store::WhenFull::Reject).
    /// Existing keys are unaffected. Nothing was stored.
    #[error("the limiter tracks its maximum of {max_keys} keys; a new key was rejected")]
    StoreFull {
        /// The store's cap on keys.
        max_keys: usize,
    },
    /// The key is new and its shard's table must be rebuilt to hold it,
    /// but the two tables that shard replaced last are still being read by
    /// a check that has not left them: a thread stalled inside the
    /// lock-free store (a key's `Eq` blocked on a lock, a thread
    /// descheduled mid-check), which holds back the reclamation of every
    /// replaced table. The key is refused so that memory stays bounded at
    /// every instant, rather than keep one more table per rebuild for as
    /// long as the stall lasts. A temporary refusal, unlike the other
    /// variants: the same key is admitted once the stalled check leaves.
    /// Stored keys are unaffected; a key evicted as idle is new again.
    ///
    /// On Linux the store also refuses so, with no check stalled, while the
    /// kernel refuses the `membarrier(2)` that ends a grace period after it
    /// accepted the process's registration for it (a seccomp filter
    /// installed once the process ran): the replaced tables cannot be known
    /// unread, so they stay, and new keys that need a rebuild are refused
    /// until the kernel runs the barrier again. A filter in place before
    /// the first lock-free store is built that makes `membarrier` fail
    /// with an error leaves the store on fences, which the kernel cannot
    /// refuse; one that kills the process on that call kills it then.
    /// Under a cap whose policy is
    /// [`WhenFull::AdmitUntracked`](crate::store::WhenFull::AdmitUntracked)
    /// the key is decided fresh and not stored instead. Nothing was stored.
    #[error(
        "a new key needs room that a check stalled inside the store still holds; it was refused"
    )]
    Reclaiming,
    /// The cost is larger than the burst, so it could never be admitted, at
    /// any time. Nothing was consumed.
    #[error("a cost of {cost} can never be admitted: the burst capacity is {capacity}")]
    InsufficientCapacity {
        /// The requested cost.
        cost: u32,
        /// The most the quota can ever admit at once (its burst).
        capacity: u32,
    },
    /// The check carried a quota the limiter cannot decide by on the
    /// states it keeps ([`RateLimiter::check_with`](crate::RateLimiter::check_with)).
    /// Nothing was consumed or stored.
    #[error(transparent)]
    Layout(#[from] LayoutError),
}
