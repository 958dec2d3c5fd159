//! The token bucket, refilled lazily on read.

use super::interval::{Interval, released_ns};
use super::{Algorithm, Carry, CarryAt, Receipt, Refund, Verdict};
use crate::clock::clamp_time;
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;

/// A token bucket: holds up to `burst` tokens, refills one token per emission
/// interval, and a request of `cost` units takes `cost` tokens.
///
/// Rate and burst are separate dials, unlike the fixed window's one.
///
/// The refill is computed on read from the stored instant, never by a timer,
/// so an idle key costs its stored state and no CPU. Tokens are counted in
/// integer nanoseconds of refill time (a deficit below full), so the refill is
/// exact: no float, no rounding drift, and `retry_after` is the exact wait.
///
/// Refill is a function of elapsed time, not of the decision: a denial's
/// refilled state is implied by the stored one (`min(full, x + a + b) ==
/// min(full, min(full, x + a) + b)`), so a denial has nothing to write, and a
/// bucket hammered above its rate admits exactly `burst + rate × elapsed`.
///
/// A clock reading older than the last refill is treated as "no time has
/// passed".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    interval: Interval,
}

/// A token-bucket key: how far below full it was at `last_ns`, in nanoseconds
/// of refill. The default (no deficit) is a full bucket.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    deficit_ns: u64,
    last_ns: u64,
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;
    type Admission = TokenBucketState;

    fn from_quota(quota: &Quota) -> Self {
        Self {
            interval: Interval::from_quota(quota),
        }
    }

    /// Every quota: the state is the refill time booked (an instant or a
    /// deficit), which any quota reads. A key read under a quota of
    /// another rate keeps the time it booked, so the units it has left are
    /// counted in the new quota's intervals.
    fn for_quota(&self, quota: &Quota) -> Result<Self, LayoutError> {
        Ok(Self::from_quota(quota))
    }

    fn capacity(&self) -> u32 {
        self.interval.capacity()
    }

    /// The deficit left at the reading is carried (see [`Carry`]) and
    /// dated at it (a reading older than the bucket's is its own instant,
    /// as in `decide`), at whichever end of `at` leaves more owed. A full
    /// bucket stays as it is.
    fn carry(
        &self,
        to: &Self,
        carry: Carry,
        state: &TokenBucketState,
        at: CarryAt,
    ) -> Option<TokenBucketState> {
        if to == self {
            return Some(*state);
        }
        // When the bucket would be full again: `last + deficit`.
        let full_ns = state.last_ns.saturating_add(state.deficit_ns);
        let carried_at = |now_ns: u64| {
            let now_ns = clamp_time(now_ns).max(state.last_ns);
            let deficit_ns = full_ns.saturating_sub(now_ns);
            if deficit_ns == 0 {
                return None;
            }
            let deficit_ns = self.interval.carry_debt(&to.interval, carry, deficit_ns);
            Some((now_ns.saturating_add(deficit_ns), now_ns))
        };
        let Some((full_a, now_a)) = carried_at(at.now_ns) else {
            return Some(*state);
        };
        let (full, now_ns) = match carried_at(at.now_ns.saturating_add(at.disorder_ns)) {
            Some((full_b, now_b)) if full_b > full_a => (full_b, now_b),
            _ => (full_a, now_a),
        };
        Some(TokenBucketState {
            deficit_ns: full - now_ns,
            last_ns: now_ns,
        })
    }

    #[inline]
    fn decide(
        &self,
        state: &TokenBucketState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<TokenBucketState>, CheckError> {
        // An older reading means no time has passed since the last refill.
        let now_ns = clamp_time(now_ns).max(state.last_ns);
        let refilled_ns = now_ns - state.last_ns;
        let deficit_ns = state.deficit_ns.saturating_sub(refilled_ns);
        Ok(self
            .interval
            .decide(deficit_ns, cost)?
            .map_admission(|new_deficit_ns| TokenBucketState {
                deficit_ns: new_deficit_ns,
                last_ns: now_ns,
            }))
    }

    #[inline]
    fn admit(&self, state: &mut TokenBucketState, admission: TokenBucketState) {
        *state = admission;
    }

    fn rest_ns(&self) -> u64 {
        self.interval.tolerance_ns()
    }

    /// Charges the admission's refill time, as this quota counts it.
    fn receipt(&self, decision: &Decision, now_ns: u64, cost: u32) -> Option<Receipt> {
        Receipt::new(decision, now_ns, self.interval.charge_ns(cost))
    }

    /// The admission left a deficit of `reset_after`, measured at its
    /// reading. If the key still holds that state, taking the admission
    /// back lowers the deficit by the charge, measured at the same instant
    /// (the refill up to then is the same either way). The bucket stays
    /// dated at that instant, where the one before the admission may have
    /// been dated earlier: a later check whose reading is older than the
    /// admission's is decided as at the admission's, with the refill up to
    /// it, which the bucket before would not have counted. If others followed
    /// (or the admission's reading was older than the state's, which then
    /// measured at its own instant), the deficit drops by the charge less
    /// the time elapsed since (`interval::released_ns`): the bucket's
    /// `last + deficit` moves as GCRA's TAT does.
    fn release(
        &self,
        state: &TokenBucketState,
        receipt: &Receipt,
        now_ns: Option<u64>,
    ) -> Option<(TokenBucketState, Refund)> {
        let written = TokenBucketState {
            deficit_ns: receipt.reset_after_ns(),
            last_ns: receipt.now_ns(),
        };
        if *state == written {
            let deficit_ns = written.deficit_ns.checked_sub(receipt.charge())?;
            return Some((
                TokenBucketState {
                    deficit_ns,
                    ..written
                },
                Refund::Full,
            ));
        }
        let released_ns = released_ns(receipt.charge(), receipt.now_ns(), now_ns?);
        (released_ns > 0).then(|| {
            let released = TokenBucketState {
                deficit_ns: state.deficit_ns.saturating_sub(released_ns),
                last_ns: state.last_ns,
            };
            (released, Refund::Partial)
        })
    }

    /// Idle once the deficit has refilled: a full bucket, as a fresh key.
    /// Not at a reading older than the state's: there the state counts from
    /// its own instant, which a fresh key does not (a full bucket a refund
    /// left at `last` decides otherwise than a fresh one at an older
    /// reading).
    fn is_idle(&self, state: &TokenBucketState, now_ns: u64) -> bool {
        let now_ns = clamp_time(now_ns);
        now_ns >= state.last_ns && state.deficit_ns <= now_ns - state.last_ns
    }
}
