//! The arithmetic GCRA and the token bucket share.
//!
//! Both describe a key by its *debt*: how much of its capacity is in use,
//! measured in nanoseconds of refill time. A full key owes nothing; each unit
//! admitted adds one emission interval; time pays it back one nanosecond per
//! nanosecond. A request of `cost` units fits while
//! `debt + cost × emission_interval <= tolerance`, where the tolerance is
//! `burst × emission_interval`, the refill time of a drained key.
//!
//! The two algorithms differ only in how they store the debt (GCRA: as the
//! instant it will be paid off; the token bucket: as an amount and the instant
//! it was measured), so this decision is written once and both call it.

use super::{Carry, Verdict, to_u32, validate_cost};
use crate::clock::{MAX_SPAN_NS, clamp_time};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::quota::Quota;

/// How far two threads' readings of one clock may stand out of order: a
/// refund that others followed ([`released_ns`]) gives back this much less,
/// so that a reading taken after another thread's may stand up to this
/// far before it (the time-stamp counter's cores differ by a few
/// nanoseconds; see `TscClock`).
const CLOCK_MARGIN_NS: u64 = 1_000;

/// The debt a refund at `now_ns` takes off a key whose admission, decided
/// at `admitted_ns`, added `charge_ns` and was followed by others: the
/// charge less the time elapsed since (and [`CLOCK_MARGIN_NS`]). Never
/// more than the debt the admission still accounts for: after it, the
/// key's debt path with it and the one without differ by the charge, and
/// the difference shrinks only where a later admission's reading passes
/// the debt-free path's arrival time, by at most how far that reading
/// lies past `admitted_ns` (note 11, "All or nothing").
pub(crate) fn released_ns(charge_ns: u64, admitted_ns: u64, now_ns: u64) -> u64 {
    let elapsed_ns = clamp_time(now_ns)
        .saturating_add(CLOCK_MARGIN_NS)
        .saturating_sub(admitted_ns);
    charge_ns.saturating_sub(elapsed_ns)
}

/// A quota's constants in debt form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interval {
    capacity: u32,
    emission_interval_ns: u64,
    /// `capacity × emission_interval_ns`; `Quota` guarantees it fits.
    tolerance_ns: u64,
}

impl Interval {
    pub(crate) fn from_quota(quota: &Quota) -> Self {
        let emission_interval_ns = quota.emission_interval_ns();
        Self {
            capacity: quota.burst(),
            emission_interval_ns,
            tolerance_ns: u64::from(quota.burst()) * emission_interval_ns,
        }
    }

    pub(crate) const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// A drained key's refill time.
    pub(crate) const fn tolerance_ns(&self) -> u64 {
        self.tolerance_ns
    }

    /// The debt `cost` units add: `cost` emission intervals.
    pub(crate) fn cost_ns(&self, cost: u32) -> u64 {
        u64::from(cost) * self.emission_interval_ns
    }

    /// The debt `cost` units add, saturating: a receipt's charge.
    pub(crate) fn charge_ns(&self, cost: u32) -> u64 {
        u64::from(cost).saturating_mul(self.emission_interval_ns)
    }

    /// The same constants with the tolerance widened by `extra_ns` (at
    /// most to `MAX_SPAN_NS`, which keeps every TAT within range): a check
    /// against it admits a request up to `extra_ns` before it conforms,
    /// which is a reservation of its future slot (`crate::wait`).
    pub(crate) fn widened(&self, extra_ns: u64) -> Self {
        Self {
            tolerance_ns: self.tolerance_ns.saturating_add(extra_ns).min(MAX_SPAN_NS),
            ..*self
        }
    }

    /// The debt a key owing `debt_ns` under these constants owes under
    /// `to`'s, by `carry` (see [`Carry`]): rounded up to the nanosecond,
    /// so that it never leaves more free than the strategy's exact
    /// arithmetic, and at most [`MAX_SPAN_NS`]. A key owing nothing owes
    /// nothing. Debt beyond the tolerance (reservations waiting for their
    /// slots, fixed in time) is kept as it is, after the carried tolerance,
    /// so that checks after the change still come after every reservation.
    pub(crate) fn carry_debt(&self, to: &Self, carry: Carry, debt_ns: u64) -> u64 {
        if debt_ns == 0 {
            return 0;
        }
        let booked = debt_ns.saturating_sub(self.tolerance_ns);
        let debt = i128::from(debt_ns.min(self.tolerance_ns));
        let carried = match carry {
            // Free time `tolerance − debt` counts units of this interval;
            // the same units free under `to`, at most its burst, leave the
            // rest owed.
            Carry::AsIs => {
                let free = i128::from(self.tolerance_ns) - debt;
                let free_to = (free * i128::from(to.emission_interval_ns))
                    / i128::from(self.emission_interval_ns);
                i128::from(to.tolerance_ns) - free_to.min(i128::from(to.tolerance_ns))
            }
            // The fraction of the tolerance owed is kept.
            Carry::Proportional => {
                let scaled = debt * i128::from(to.tolerance_ns);
                let tolerance = i128::from(self.tolerance_ns);
                (scaled + tolerance - 1) / tolerance
            }
            Carry::Unchanged => return debt_ns,
        };
        u64::try_from(carried.max(0))
            .unwrap_or(u64::MAX)
            .saturating_add(booked)
            .min(MAX_SPAN_NS)
    }

    /// The decision of an admission that leaves `debt_ns` owed.
    pub(crate) fn allowed(&self, debt_ns: u64) -> Decision {
        Decision::allow(self.capacity, self.units_free(debt_ns), debt_ns)
    }

    /// Decides `cost` units against a key owing `debt_ns`. The admission is the
    /// debt after admitting.
    #[inline]
    pub(crate) fn decide(&self, debt_ns: u64, cost: u32) -> Result<Verdict<u64>, CheckError> {
        let cost = validate_cost(cost, self.capacity)?;
        // cost <= capacity, so this is at most tolerance_ns: no overflow.
        let cost_ns = self.cost_ns(cost);
        // The most debt at which `cost` still fits.
        let max_debt_ns = self.tolerance_ns - cost_ns;
        if debt_ns <= max_debt_ns {
            let new_debt_ns = debt_ns + cost_ns;
            Ok(Verdict::Allow {
                decision: self.allowed(new_debt_ns),
                admission: new_debt_ns,
            })
        } else {
            // Integer nanoseconds throughout: the wait is exact, so retrying
            // at it succeeds and one nanosecond earlier does not. It is
            // positive (debt > max_debt) and at most the debt, which is the
            // reset time.
            Ok(Verdict::Deny(Decision::deny(
                self.capacity,
                self.units_free(debt_ns),
                debt_ns - max_debt_ns,
                debt_ns,
            )))
        }
    }

    /// Whole unit requests that fit beside `debt_ns`.
    #[inline]
    fn units_free(&self, debt_ns: u64) -> u32 {
        let free_ns = self.tolerance_ns.saturating_sub(debt_ns);
        // A drained key (the deny path's usual case) has less than one
        // interval free: answer without a 64-bit division.
        if free_ns < self.emission_interval_ns {
            0
        } else {
            to_u32(free_ns / self.emission_interval_ns)
        }
    }
}
