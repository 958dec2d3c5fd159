//! The sliding window log: exact, at a price in memory.

use std::collections::VecDeque;

use super::{
    Algorithm, Carry, CarryAt, Receipt, Refund, Verdict, carry_count, same_window, to_u32,
    validate_cost,
};
use crate::clock::clamp_time;
use crate::decision::Decision;
use crate::error::{CheckError, LayoutError};
use crate::quota::Quota;

/// A sliding window log: remembers the instant of every admitted unit and
/// admits while fewer than `burst` fall inside the trailing window
/// `(now − window, now]` (window: [`Quota::burst_window`]).
///
/// The only exact algorithm here: over **any** span of one window it never
/// admits more than `burst`. It pays in memory: 8 bytes per admitted unit
/// still in the window. The log of a key is a ring that grows on demand to
/// at most `burst` timestamps (it never needs more: no more than `burst` are
/// ever inside the window), so a key that sent little costs little, and a key
/// at its limit costs `8 × burst` bytes. Choose it for small limits (logins per
/// hour); at a limit of thousands per key it is the wrong tool.
///
/// A clock reading older than the newest stored timestamp is treated as that
/// timestamp: no time has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowLog {
    capacity: u32,
    window_ns: u64,
}

/// A sliding-window-log key: admission instants, oldest first. Timestamps that
/// have left the window are dropped at the next admission. The default (an
/// empty log, no allocation) is a fresh key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SlidingWindowLogState {
    stamps_ns: VecDeque<u64>,
}

impl SlidingWindowLogState {
    /// Timestamps currently stored (some may have left the window).
    #[must_use]
    pub fn len(&self) -> usize {
        self.stamps_ns.len()
    }

    /// Whether nothing is stored.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.stamps_ns.is_empty()
    }

    /// Timestamps the ring has room for without reallocating; never more than
    /// the largest burst the key was admitted under.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.stamps_ns.capacity()
    }
}

/// The change an admission makes to a log: `cost` timestamps at `now_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowLogAdmission {
    now_ns: u64,
    cost: u32,
}

impl SlidingWindowLog {
    /// Whether a unit admitted at `stamp_ns` has left the window `(now − window, now]`.
    #[inline]
    fn has_left(&self, stamp_ns: u64, now_ns: u64) -> bool {
        stamp_ns + self.window_ns <= now_ns
    }

    /// How many stored timestamps have left the window (they are the oldest).
    #[inline]
    fn departed(&self, state: &SlidingWindowLogState, now_ns: u64) -> usize {
        state
            .stamps_ns
            .partition_point(|&stamp_ns| self.has_left(stamp_ns, now_ns))
    }

    /// Time from `now_ns` until a unit admitted at `stamp_ns` leaves the window.
    #[inline]
    fn leaves_in_ns(&self, stamp_ns: u64, now_ns: u64) -> u64 {
        (stamp_ns + self.window_ns).saturating_sub(now_ns)
    }
}

impl Algorithm for SlidingWindowLog {
    type State = SlidingWindowLogState;
    type Admission = SlidingWindowLogAdmission;

    fn from_quota(quota: &Quota) -> Self {
        Self {
            capacity: quota.burst(),
            window_ns: quota.burst_window_ns(),
        }
    }

    /// Every quota of the same burst window. A log read under a quota of
    /// another burst keeps its stamps: the units admitted inside the
    /// trailing window count against that quota's burst, and the ring grows
    /// to at most the largest burst it was admitted under.
    fn for_quota(&self, quota: &Quota) -> Result<Self, LayoutError> {
        same_window(self.window_ns, quota)?;
        Ok(Self::from_quota(quota))
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The stamps still in the window at `now` are carried as a count
    /// (see [`Carry`]): fewer keep the newest, more add stamps at `now`
    /// (the latest instant, so the most conservative). `to` counts in the
    /// same windows.
    fn carry(
        &self,
        to: &Self,
        carry: Carry,
        state: &SlidingWindowLogState,
        at: CarryAt,
    ) -> Option<SlidingWindowLogState> {
        let mut carried = state.clone();
        if carry == Carry::Unchanged || to == self {
            return Some(carried);
        }
        let newest_ns = state.stamps_ns.back().copied();
        let now_ns = newest_ns.map_or(clamp_time(at.now_ns), |newest_ns| {
            clamp_time(at.now_ns).max(newest_ns)
        });
        carried.stamps_ns.drain(..self.departed(state, now_ns));
        let live = to_u32(carried.stamps_ns.len() as u64);
        let kept = carry_count(self.capacity, to.capacity, carry, live);
        if kept <= live {
            carried.stamps_ns.drain(..(live - kept) as usize);
        } else {
            carried
                .stamps_ns
                .extend(std::iter::repeat_n(now_ns, (kept - live) as usize));
        }
        Some(carried)
    }

    fn decide(
        &self,
        state: &SlidingWindowLogState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<SlidingWindowLogAdmission>, CheckError> {
        let cost = validate_cost(cost, self.capacity)?;
        let newest_ns = state.stamps_ns.back().copied();
        let now_ns = clamp_time(now_ns);
        let now_ns = newest_ns.map_or(now_ns, |newest_ns| now_ns.max(newest_ns));
        let departed = self.departed(state, now_ns);
        // The ring never holds more than `capacity` stamps, a u32.
        let live = to_u32((state.stamps_ns.len() - departed) as u64);
        let free = self.capacity.saturating_sub(live);
        if cost <= free {
            return Ok(Verdict::Allow {
                // The newest stamp will be `now`: full reset one window away.
                decision: Decision::allow(self.capacity, free - cost, self.window_ns),
                admission: SlidingWindowLogAdmission { now_ns, cost },
            });
        }
        // The oldest `live + cost − capacity` live units must leave first; the
        // last of them to leave decides the wait. cost <= capacity, so that is
        // at most `live` units: the index is inside the ring.
        let must_leave = u64::from(live) + u64::from(cost) - u64::from(self.capacity);
        let must_leave = usize::try_from(must_leave).unwrap_or(usize::MAX);
        let deciding_ns = state.stamps_ns[departed + must_leave - 1];
        let reset_after_ns = newest_ns.map_or(0, |newest_ns| self.leaves_in_ns(newest_ns, now_ns));
        Ok(Verdict::Deny(Decision::deny(
            self.capacity,
            free,
            self.leaves_in_ns(deciding_ns, now_ns),
            reset_after_ns,
        )))
    }

    fn admit(&self, state: &mut SlidingWindowLogState, admission: SlidingWindowLogAdmission) {
        let departed = self.departed(state, admission.now_ns);
        state.stamps_ns.drain(..departed);
        let needed = state.stamps_ns.len() + admission.cost as usize;
        if needed > state.stamps_ns.capacity() {
            // Grow geometrically but never past the burst: `decide` admitted,
            // so `needed <= capacity`.
            let target = needed
                .max(2 * state.stamps_ns.capacity())
                .min(self.capacity as usize)
                .max(needed);
            state
                .stamps_ns
                .reserve_exact(target - state.stamps_ns.len());
        }
        state.stamps_ns.extend(std::iter::repeat_n(
            admission.now_ns,
            admission.cost as usize,
        ));
    }

    /// The newest stamp leaves the window one window after it was made.
    fn rest_ns(&self) -> u64 {
        self.window_ns
    }

    /// The admission stamped its units with its reading, unless the log
    /// held a newer stamp (then with that one): the units stamped with the
    /// reading leave the log, which then decides as if they had never been
    /// admitted (stamps of one instant are alike). Units already gone (the
    /// window passed, the key was evicted) leave nothing to give back. A
    /// stale reading's units, stamped with the newer instant, stay; what
    /// leaves then is as many units stamped with the reading, if any, which
    /// leaves the log holding newer stamps than it would: never more
    /// lenient.
    fn release(
        &self,
        state: &SlidingWindowLogState,
        receipt: &Receipt,
        _now_ns: Option<u64>,
    ) -> Option<(SlidingWindowLogState, Refund)> {
        let stamp_ns = receipt.now_ns();
        let first = state.stamps_ns.partition_point(|&stamp| stamp < stamp_ns);
        let stamped = state
            .stamps_ns
            .range(first..)
            .take_while(|&&stamp| stamp == stamp_ns)
            .count();
        let charge = usize::try_from(receipt.charge()).unwrap_or(usize::MAX);
        let leaving = stamped.min(charge);
        if leaving == 0 {
            return None;
        }
        let mut released = state.clone();
        released.stamps_ns.drain(first..first + leaving);
        let refund = if leaving == charge {
            Refund::Full
        } else {
            Refund::Partial
        };
        Some((released, refund))
    }

    /// Idle when every stored stamp has left the window.
    fn is_idle(&self, state: &SlidingWindowLogState, now_ns: u64) -> bool {
        state
            .stamps_ns
            .back()
            .is_none_or(|&newest_ns| self.has_left(newest_ns, clamp_time(now_ns)))
    }
}
