//! The five rate-limiting algorithms, as pure arithmetic.
//!
//! Each algorithm is a value built from a [`Quota`] (its constants computed
//! once) and a `State` type (what one key stores). Its decision is a pure
//! function, [`Algorithm::decide`], of (state, now, cost): it reads the state
//! and returns a [`Verdict`], touching no atomic and no lock. What an admission
//! changes is returned as an [`Algorithm::Admission`] that the caller applies
//! with [`Algorithm::admit`] under whatever discipline guards the state (one
//! global mutex, a shard's mutex, a per-key mutex or a compare-and-swap).
//! Every store and cell calls these same functions, so a benchmark that swaps
//! the discipline varies exactly one thing.
//!
//! **A denial writes nothing**, in every algorithm: each state is stored in a
//! form that the passage of time does not invalidate (a token bucket's refill
//! is recomputed from the stored instant on every read), so a denial has
//! nothing to record. This is what lets the atomic cells deny with a single
//! load.
//!
//! | algorithm | state per key | burst behaviour |
//! |---|---|---|
//! | [`FixedWindow`] | window index + count (12 B, 16 with padding) | up to 2 × burst across a window boundary |
//! | [`TokenBucket`] | deficit + last refill instant (16 B) | at most burst + rate × t over any span t |
//! | [`Gcra`] | theoretical arrival time (8 B) | identical decisions to the token bucket |
//! | [`SlidingWindowLog`] | ring of up to `burst` timestamps (8 B each) | exact: at most burst in any window |
//! | [`SlidingWindowCounter`] | window index + two counts (16 B) | at most burst in any window (estimate errs low) |

mod fixed_window;
mod gcra;
mod interval;
mod sliding_log;
pub(crate) mod sliding_window_counter;
mod token_bucket;

use std::fmt::Debug;
use std::num::NonZeroU64;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::{Gcra, GcraState};
pub use sliding_log::{SlidingWindowLog, SlidingWindowLogAdmission, SlidingWindowLogState};
pub use sliding_window_counter::{SlidingWindowCounter, SlidingWindowCounterState};
pub use token_bucket::{TokenBucket, TokenBucketState};

use crate::clock::{clamp_time, saturating_nanos};
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;

/// A rate-limiting algorithm: constants derived from a [`Quota`], a per-key
/// state, and a pure decision function.
///
/// The pure functions are public so that the same arithmetic can drive state
/// kept elsewhere (a database row, a shared-memory segment):
///
/// ```
/// use tollgate::Quota;
/// use tollgate::algorithm::{Algorithm, TokenBucket};
///
/// # #[cfg(not(any(feature = "loom", feature = "shuttle")))]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let bucket = TokenBucket::from_quota(&Quota::per_second(2)?);
/// let mut state = Default::default(); // a fresh key: a full bucket
/// assert!(bucket.check(&mut state, 0, 1)?.is_allowed());
/// assert!(bucket.check(&mut state, 0, 1)?.is_allowed());
/// let denied = bucket.check(&mut state, 0, 1)?;
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after().as_millis(), 500);
/// # Ok(())
/// # }
/// # #[cfg(any(feature = "loom", feature = "shuttle"))] fn main() {}
/// ```
pub trait Algorithm: Debug + Send + Sync + Sized + 'static {
    /// What one key stores. `Default` is the state of a key never seen (or
    /// fully rested): a fresh key and an idle one decide identically.
    type State: Debug + Default + Send + Sync;

    /// What an admission changes, to be applied with [`Algorithm::admit`].
    type Admission: Debug + Copy;

    /// Builds the algorithm's constants from a validated quota.
    fn from_quota(quota: &Quota) -> Self;

    /// The algorithm that decides by `quota` on the states this one keeps:
    /// what lets one store hold keys checked under different quotas
    /// ([`RateLimiter::check_with`](crate::RateLimiter::check_with)).
    /// Each reads every state the other writes, packs it into the same
    /// word, and judges it idle at the same readings, so that eviction by
    /// either is exact for both.
    ///
    /// A state written under one quota is read under the other by what it
    /// records: GCRA and the token bucket by the refill time a key's
    /// admissions have booked, the window algorithms by the units counted
    /// in each window (see each algorithm).
    ///
    /// # Errors
    ///
    /// [`LayoutError::WindowDiffers`] for a window algorithm and a quota of
    /// another burst window, [`LayoutError::BurstDoesNotPack`] for a
    /// sliding window counter whose word cannot hold the quota's burst,
    /// and (the default, for an algorithm that does not implement it)
    /// [`LayoutError::Unsupported`].
    fn for_quota(&self, quota: &Quota) -> Result<Self, LayoutError> {
        let _ = quota;
        Err(LayoutError::Unsupported)
    }

    /// The most unit requests a key can hold at once (the quota's burst).
    fn capacity(&self) -> u32;

    /// `state`, read at `at`, carried over to `to` (this algorithm's
    /// [`for_quota`](Algorithm::for_quota) of a new quota) by the strategy
    /// `carry`: what a key keeps when its limiter's quota changes
    /// ([`RateLimiter::set_quota`](crate::RateLimiter::set_quota)). `None`
    /// (the default) for an algorithm that does not implement it.
    ///
    /// Every strategy keeps an idle key idle (an idle key decides as an
    /// absent one, which has no state to carry), and rounds toward the
    /// units used, never toward the units free. A `to` equal to `self`
    /// keeps every state as it is, by every strategy: a state read at the
    /// change and written back could decide otherwise at a later reading
    /// that steps back before it (a window rolled on, a refill moved), and
    /// Redis's script leaves such a key alone. See [`Carry`] and each
    /// algorithm for what a state keeps.
    fn carry(
        &self,
        to: &Self,
        carry: Carry,
        state: &Self::State,
        at: CarryAt,
    ) -> Option<Self::State> {
        let _ = (to, carry, state, at);
        None
    }

    /// Decides a request of `cost` units at `now_ns` against `state`, without
    /// changing anything.
    ///
    /// A reading `now_ns` older than the state never admits more than the
    /// newer reading would have, and never underflows; a reading past
    /// [`END_OF_TIME_NS`](crate::clock::END_OF_TIME_NS) is read as it.
    ///
    /// # Errors
    ///
    /// [`CheckError::ZeroCost`] for a cost of 0, and
    /// [`CheckError::InsufficientCapacity`] for a cost above
    /// [`capacity`](Algorithm::capacity): requests no wait could admit.
    fn decide(
        &self,
        state: &Self::State,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<Self::Admission>, CheckError>;

    /// Applies an admission returned by [`decide`](Algorithm::decide) on the
    /// same `state`.
    fn admit(&self, state: &mut Self::State, admission: Self::Admission);

    /// Whether `state` decides exactly as a fresh key would at `now_ns` and at
    /// every later reading, so that forgetting the key changes no decision.
    /// Idle eviction removes only such keys. Once idle, a state stays idle
    /// until its next admission.
    fn is_idle(&self, state: &Self::State, now_ns: u64) -> bool;

    /// The longest a key can take to become idle after its last admission
    /// (for a drained key: its full refill). Stores evict, as they grow, only
    /// keys that have been idle this long (a key merely between two requests
    /// stays), so that keys in use are not evicted and re-inserted.
    fn rest_ns(&self) -> u64;

    /// The receipt of an admission of `cost` units at `now_ns` that
    /// returned `decision` ([`Receipt`]); `None` for a denial. By default
    /// its charge is the cost in units; GCRA and the token bucket charge
    /// refill time.
    fn receipt(&self, decision: &Decision, now_ns: u64, cost: u32) -> Option<Receipt> {
        Receipt::new(decision, now_ns, u64::from(cost))
    }

    /// Takes the admission `receipt` records out of `state`: the state to
    /// install and how much of the admission it gives back, or `None` when
    /// nothing is to be given back (the key holds no trace of it, or the
    /// algorithm cannot tell; the default).
    ///
    /// The state returned never decides more leniently, at any reading
    /// from the admission's on, than one that never saw the admission but
    /// saw every other admission `state` holds, so that a refund never
    /// admits more than the quota. (At an older reading, a clock stepped
    /// back or another thread's reading behind, a state is read as at its
    /// own instant: see note 14 for what a refund changes there.) For the window
    /// algorithms it is that state exactly ([`Refund::Full`]): the
    /// admission's units leave its window's count (or the log's stamps).
    /// For GCRA and the token bucket, whose state does not tell one
    /// admission's time from another's once others follow, it is exact
    /// while no other admission has followed, and otherwise gives back
    /// the admission's refill time less the time elapsed since it
    /// ([`Refund::Partial`]), measured to `now_ns`: a reading taken after
    /// `state` was loaded, from a clock whose readings are
    /// [`ordered`](crate::clock::Clock::ordered) (`None` where the clock's
    /// are not: then it gives nothing back). See note 11.
    fn release(
        &self,
        state: &Self::State,
        receipt: &Receipt,
        now_ns: Option<u64>,
    ) -> Option<(Self::State, Refund)> {
        let _ = (state, receipt, now_ns);
        None
    }

    /// Decides and, if admitted, applies: the whole check for a caller that
    /// holds the state exclusively.
    ///
    /// # Errors
    ///
    /// As [`decide`](Algorithm::decide); nothing is changed on error.
    #[inline]
    fn check(
        &self,
        state: &mut Self::State,
        now_ns: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let verdict = self.decide(state, now_ns, cost)?;
        let decision = verdict.decision();
        if let Verdict::Allow { admission, .. } = verdict {
            self.admit(state, admission);
        }
        Ok(decision)
    }
}

/// An algorithm whose whole state packs into one `u64`, so that a
/// compare-and-swap can update it without a lock
/// ([`Atomic`](crate::cell::Atomic)). Its admission is the new state.
///
/// The state is `Copy`: a word's worth of plain data, with no `Drop`. The
/// atomic cell makes a state from the word on every check and drops it
/// after its compare-and-swap; a state with a `Drop` of its own could then
/// panic after the admission was written.
pub trait PackedAlgorithm: Algorithm<State: Copy, Admission = <Self as Algorithm>::State> {
    /// The state as a word. Never `u64::MAX`: the atomic cell reserves that
    /// value to mark a cell taken out of service.
    fn pack(&self, state: &Self::State) -> u64;

    /// The state a word produced by [`pack`](PackedAlgorithm::pack) holds.
    fn unpack(&self, word: u64) -> Self::State;
}

/// What giving an admission back takes
/// ([`RateLimiter::refund`](crate::RateLimiter::refund),
/// [`Algorithm::release`]): the reading the admission was decided at, what
/// it charged (units for the window algorithms, refill time for GCRA and
/// the token bucket, as the quota that admitted it counts them) and its
/// decision's reset time, from which each algorithm finds what the
/// admission wrote. Made by [`Algorithm::receipt`].
///
/// Neither `Clone` nor `Copy`: a refund consumes it, so that one admission
/// is given back at most once. A limiter's refund takes only its own
/// receipts (one made by hand, or by another limiter, gives back nothing),
/// and gives back to the key it is told: a receipt belongs to its key, and
/// used with another key it would take that key's admissions back.
#[derive(Debug, PartialEq, Eq)]
pub struct Receipt {
    now_ns: u64,
    charge: u64,
    reset_after_ns: u64,
    /// The limiter that made it; `None` for one made by hand.
    issuer: Option<NonZeroU64>,
}

impl Receipt {
    /// The receipt of `decision`, made by a check at `now_ns` that charged
    /// `charge`; `None` for a denial, which took nothing.
    #[must_use]
    pub fn new(decision: &Decision, now_ns: u64, charge: u64) -> Option<Self> {
        decision.is_allowed().then(|| Self {
            now_ns: clamp_time(now_ns),
            charge,
            reset_after_ns: saturating_nanos(decision.reset_after()),
            issuer: None,
        })
    }

    /// The receipt, stamped as `issuer`'s.
    pub(crate) const fn issued_by(self, issuer: NonZeroU64) -> Self {
        Self {
            issuer: Some(issuer),
            ..self
        }
    }

    /// The limiter that made it.
    pub(crate) const fn issuer(&self) -> Option<NonZeroU64> {
        self.issuer
    }

    /// The reading the admission was decided at (clamped to
    /// [`END_OF_TIME_NS`](crate::clock::END_OF_TIME_NS)).
    #[must_use]
    pub const fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// What the admission charged: units, or refill time in nanoseconds
    /// (see [`Algorithm::receipt`]).
    #[must_use]
    pub const fn charge(&self) -> u64 {
        self.charge
    }

    /// The admission's decision's [`reset_after`](Decision::reset_after),
    /// in nanoseconds.
    #[must_use]
    pub const fn reset_after_ns(&self) -> u64 {
        self.reset_after_ns
    }
}

/// What each key keeps when its limiter's quota changes at runtime
/// ([`RateLimiter::set_quota`](crate::RateLimiter::set_quota)): the
/// strategies of Bucket4j's `TokensInheritanceStrategy`, and the reading a
/// carried quota makes.
///
/// Say a key has `a` units available of a burst `b`, and the new burst is
/// `b'`. Every strategy leaves an idle key idle (it decides as an absent
/// key, which has nothing to carry: its whole new burst), and none lets a
/// window that spans the change admit more than `max(b, b')` units plus
/// what each quota refills in its part of it (note 14 proves it). A limiter
/// whose checks carry quotas of their own (tiers) changes only by
/// [`Carry::Unchanged`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Carry {
    /// The units available are kept, at most the new burst: `a' = min(a,
    /// b')`. A raise gives keys in use no new units at once (they refill at
    /// the new rate); a cut takes away only what exceeds the new burst.
    AsIs,
    /// The fraction of the burst available is kept: `a' = a × b' / b`. A
    /// key that had half its burst left has half the new one left.
    Proportional,
    /// The state is kept as it is and read under the new quota, as a
    /// [`check_with`](crate::RateLimiter::check_with) reads it: GCRA and the
    /// token bucket keep the refill time booked (units used count in the
    /// new quota's intervals), the window algorithms keep their counts (a
    /// raise adds `b' − b` units free to every key).
    Unchanged,
}

/// When a change carries a state ([`Algorithm::carry`]): a clock reading
/// taken after the state stopped changing, and how far the readings the
/// state was written from may stand after it (other threads' readings of a
/// clock ordered only to within a margin: see
/// [`Clock::disorder_ns`](crate::clock::Clock::disorder_ns)). An algorithm
/// whose carry depends on the instant carries at whichever of the two ends
/// leaves the key more used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CarryAt {
    /// The reading.
    pub now_ns: u64,
    /// How far after it the readings that wrote the state may stand.
    pub disorder_ns: u64,
}

/// How much of an admission a refund gave back
/// ([`RateLimiter::refund`](crate::RateLimiter::refund)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refund {
    /// All of it: every later decision is the one it would have been
    /// without the admission.
    Full,
    /// Part of it (GCRA and the token bucket, once other admissions
    /// followed it): all of its refill time but the time elapsed since it
    /// was decided, and a microsecond's margin for the clock.
    Partial,
    /// None: the key holds no trace of it (its window ended, the key was
    /// evicted as idle) or the algorithm cannot give it back.
    Nothing,
}

/// The result of [`Algorithm::decide`]: a decision, and for an admission the
/// change to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<A> {
    /// An admission: apply `admission` to consume the cost.
    Allow {
        /// What the caller is told.
        decision: Decision,
        /// The change to the state that consumes the cost.
        admission: A,
    },
    /// A denial: nothing to write.
    Deny(Decision),
}

impl<A> Verdict<A> {
    /// Returns the decision, for either outcome.
    #[inline]
    pub fn decision(&self) -> Decision {
        match self {
            Verdict::Allow { decision, .. } | Verdict::Deny(decision) => *decision,
        }
    }
}

/// Rejects the costs no wait could admit: zero, and more than `capacity`,
/// with the errors every limiter returns for them (a backend that decides
/// elsewhere calls it before its round trip).
///
/// # Errors
///
/// [`CheckError::ZeroCost`] and [`CheckError::InsufficientCapacity`].
#[inline]
pub fn validate_cost(cost: u32, capacity: u32) -> Result<u32, CheckError> {
    if cost == 0 {
        Err(CheckError::ZeroCost)
    } else if cost > capacity {
        Err(CheckError::InsufficientCapacity { cost, capacity })
    } else {
        Ok(cost)
    }
}

/// Checks that `quota` counts in windows of `window_ns`, as a window
/// algorithm's [`for_quota`](Algorithm::for_quota) requires.
fn same_window(window_ns: u64, quota: &Quota) -> Result<(), LayoutError> {
    if quota.burst_window_ns() == window_ns {
        Ok(())
    } else {
        Err(LayoutError::WindowDiffers {
            limiter: std::time::Duration::from_nanos(window_ns),
            quota: quota.burst_window(),
        })
    }
}

/// The units a window algorithm's key counts as used after a change from a
/// burst of `from` to one of `to`, by `carry`, when it had counted `used`
/// (see [`Carry`]): rounded up, and never above both `used` and `to`, so
/// that the count packs wherever the two bursts do.
fn carry_count(from: u32, to: u32, carry: Carry, used: u32) -> u32 {
    if used == 0 {
        return 0;
    }
    let (from, to_wide, used_wide) = (u64::from(from), u64::from(to), u64::from(used));
    let carried = match carry {
        // Free `from − used` (none past the burst), at most `to`.
        Carry::AsIs => to_wide - from.saturating_sub(used_wide).min(to_wide),
        Carry::Proportional => (used_wide * to_wide).div_ceil(from.max(1)),
        Carry::Unchanged => used_wide,
    };
    to_u32(carried.min(used_wide.max(to_wide)))
}

/// Clamps a count known to be at most a `u32` capacity back into `u32`.
#[inline]
pub(crate) fn to_u32(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

impl<A> Verdict<A> {
    /// Converts the admission, keeping the decision.
    #[inline]
    pub(crate) fn map_admission<B>(self, convert: impl FnOnce(A) -> B) -> Verdict<B> {
        match self {
            Verdict::Allow {
                decision,
                admission,
            } => Verdict::Allow {
                decision,
                admission: convert(admission),
            },
            Verdict::Deny(decision) => Verdict::Deny(decision),
        }
    }
}
