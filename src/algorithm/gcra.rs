//! GCRA, the generic cell rate algorithm.

use super::interval::{Interval, released_ns};
use super::{Algorithm, Carry, CarryAt, PackedAlgorithm, Receipt, Refund, Verdict};
use crate::clock::clamp_time;
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;

/// The generic cell rate algorithm (from ATM networks): a token bucket whose
/// whole state is one instant.
///
/// A key stores its *theoretical arrival time* (TAT): the instant at which it
/// would be fully rested if nothing else arrived. A request of `cost` units at
/// `now` fits while `max(tat, now) + cost × emission_interval - now <=
/// burst × emission_interval`, and admitting it moves the TAT to that sum.
///
/// Its decisions are identical to [`TokenBucket`](super::TokenBucket)'s (the
/// two share their arithmetic); it earns its place by its state, one `u64`,
/// which a compare-and-swap can update without a lock.
///
/// A clock reading older than the TAT's own timeline simply looks like a key
/// that owes more: it can only deny more, never admit more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    interval: Interval,
}

/// A GCRA key: its theoretical arrival time in clock nanoseconds. Zero (the
/// default) is a fresh key.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GcraState {
    tat_ns: u64,
}

impl GcraState {
    /// The state whose TAT is `tat_ns`.
    pub(crate) const fn at(tat_ns: u64) -> Self {
        Self { tat_ns }
    }

    /// The theoretical arrival time: when the key is fully rested.
    #[must_use]
    pub const fn tat_ns(&self) -> u64 {
        self.tat_ns
    }
}

impl Gcra {
    /// This GCRA with its tolerance widened by `extra_ns`: a check against
    /// it reserves a slot up to `extra_ns` ahead (`crate::wait`).
    pub(crate) fn widened(&self, extra_ns: u64) -> Self {
        Self {
            interval: self.interval.widened(extra_ns),
        }
    }

    /// The quota's tolerance: a drained key's refill time.
    pub(crate) const fn tolerance_ns(&self) -> u64 {
        self.interval.tolerance_ns()
    }

    /// The cost of `cost` units in nanoseconds of refill.
    pub(crate) fn cost_ns(&self, cost: u32) -> u64 {
        self.interval.cost_ns(cost)
    }

    /// The decision of an admission that leaves `debt_ns` owed.
    pub(crate) fn allowed(&self, debt_ns: u64) -> Decision {
        self.interval.allowed(debt_ns)
    }
}

impl Algorithm for Gcra {
    type State = GcraState;
    type Admission = GcraState;

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

    /// The debt the TAT books past the reading is carried
    /// (`max(tat, now) − now`, see [`Carry`]) and booked again from it, at
    /// whichever end of `at` books more. A TAT that has passed is idle and
    /// stays as it is.
    fn carry(&self, to: &Self, carry: Carry, state: &GcraState, at: CarryAt) -> Option<GcraState> {
        let carried_at = |now_ns: u64| {
            let now_ns = clamp_time(now_ns);
            let debt_ns = state.tat_ns.saturating_sub(now_ns);
            if debt_ns == 0 {
                // Idle at this reading: as it is.
                return state.tat_ns;
            }
            now_ns + self.interval.carry_debt(&to.interval, carry, debt_ns)
        };
        if to == self || state.tat_ns <= clamp_time(at.now_ns) {
            return Some(*state);
        }
        let tat_ns =
            carried_at(at.now_ns).max(carried_at(at.now_ns.saturating_add(at.disorder_ns)));
        Some(GcraState { tat_ns })
    }

    #[inline]
    fn decide(
        &self,
        state: &GcraState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<GcraState>, CheckError> {
        let now_ns = clamp_time(now_ns);
        let debt_ns = state.tat_ns.saturating_sub(now_ns);
        // max(tat, now) + cost × interval == now + new debt, which is at most
        // END_OF_TIME_NS + MAX_SPAN_NS: no overflow.
        Ok(self
            .interval
            .decide(debt_ns, cost)?
            .map_admission(|new_debt_ns| GcraState {
                tat_ns: now_ns + new_debt_ns,
            }))
    }

    #[inline]
    fn admit(&self, state: &mut GcraState, admission: GcraState) {
        *state = admission;
    }

    fn rest_ns(&self) -> u64 {
        self.interval.tolerance_ns()
    }

    /// Charges the admission's refill time, as this quota counts it.
    fn receipt(&self, decision: &Decision, now_ns: u64, cost: u32) -> Option<Receipt> {
        Receipt::new(decision, now_ns, self.interval.charge_ns(cost))
    }

    /// The admission wrote `now + debt` (its decision's reset time is the
    /// debt after it). If the key still holds that TAT, taking the
    /// admission back moves it back by the charge: if the key owed less
    /// than nothing before (its TAT had passed), that puts the TAT at
    /// `now`, which decides as the old TAT did at `now` and at every later
    /// reading. If others followed, the TAT moves back by the charge less
    /// the time elapsed since (`interval::released_ns`), unless a
    /// reservation is waiting on the key (the TAT lies more than a
    /// tolerance ahead): its slot was fixed with this admission counted.
    fn release(
        &self,
        state: &GcraState,
        receipt: &Receipt,
        now_ns: Option<u64>,
    ) -> Option<(GcraState, Refund)> {
        let written_ns = receipt.now_ns().saturating_add(receipt.reset_after_ns());
        if state.tat_ns == written_ns {
            let tat_ns = written_ns.checked_sub(receipt.charge())?;
            return Some((GcraState { tat_ns }, Refund::Full));
        }
        let now_ns = now_ns?;
        // A TAT more than a tolerance ahead holds a reservation still
        // waiting for its slot (`crate::wait`), fixed with this admission
        // counted: moving the TAT back would let checks in ahead of it.
        // Only an exact refund then (with a tier's wider tolerance, also
        // none: conservative). No clock margin here: plain checks leave the
        // TAT at most a tolerance ahead, and a key that one just filled
        // must still give back.
        if state.tat_ns > clamp_time(now_ns).saturating_add(self.interval.tolerance_ns()) {
            return None;
        }
        let released_ns = released_ns(receipt.charge(), receipt.now_ns(), now_ns);
        (released_ns > 0).then(|| {
            let tat_ns = state.tat_ns.saturating_sub(released_ns);
            (GcraState { tat_ns }, Refund::Partial)
        })
    }

    /// Idle once the TAT has passed: no debt, as a fresh key (TAT 0).
    fn is_idle(&self, state: &GcraState, now_ns: u64) -> bool {
        state.tat_ns <= clamp_time(now_ns)
    }
}

impl PackedAlgorithm for Gcra {
    /// The TAT itself. It never exceeds `END_OF_TIME_NS + MAX_SPAN_NS`
    /// (3 × 2^62), far below `u64::MAX`, the atomic cell's retired marker.
    #[inline]
    fn pack(&self, state: &GcraState) -> u64 {
        state.tat_ns
    }

    #[inline]
    fn unpack(&self, word: u64) -> GcraState {
        GcraState { tat_ns: word }
    }
}
