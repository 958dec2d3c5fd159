//! The sliding window counter: two fixed windows, the older one weighted.

use std::cmp::Ordering;

use super::{Algorithm, Verdict, to_u32, validate_cost};
use crate::clock::clamp_time;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::quota::Quota;

/// A sliding window counter: counts per aligned window like
/// [`FixedWindow`](super::FixedWindow), but estimates the trailing window as
/// the current count plus the previous window's count weighted by how much of
/// the previous window the trailing one still overlaps:
///
/// ```text
/// estimate = previous × (window − elapsed) / window + current
/// ```
///
/// A request of `cost` fits while `estimate + cost <= burst`. The comparison is
/// made exactly, in integers scaled by the window
/// (`previous × (window − elapsed) + (current + cost) × window <= burst ×
/// window`, in `u128`), so no float rounds a decision either way.
///
/// Its honest `retry_after` can exceed one window: exhaust the burst at the
/// start of a window and the estimate stays at the burst for that whole
/// window, then carries into the next with weight 1. It never exceeds
/// `reset_after`.
///
/// A clock reading from before the stored window is treated as the stored
/// window's first instant (where the previous window weighs most).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindowCounter {
    capacity: u32,
    window_ns: u64,
}

/// A sliding-window-counter key: its current window and the counts of that
/// window and the one before. The default is a fresh key.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounterState {
    window_index: u64,
    previous: u32,
    current: u32,
}

/// The state as seen from one instant: the windows rolled forward to it.
#[derive(Debug, Clone, Copy)]
struct View {
    window_index: u64,
    previous: u32,
    current: u32,
    elapsed_ns: u64,
}

impl SlidingWindowCounter {
    fn view(&self, state: &SlidingWindowCounterState, now_ns: u64) -> View {
        let now_index = now_ns / self.window_ns;
        let elapsed_ns = now_ns % self.window_ns;
        match now_index.cmp(&state.window_index) {
            Ordering::Equal => View {
                window_index: now_index,
                previous: state.previous,
                current: state.current,
                elapsed_ns,
            },
            Ordering::Greater if now_index - state.window_index == 1 => View {
                window_index: now_index,
                previous: state.current,
                current: 0,
                elapsed_ns,
            },
            Ordering::Greater => View {
                window_index: now_index,
                previous: 0,
                current: 0,
                elapsed_ns,
            },
            Ordering::Less => View {
                window_index: state.window_index,
                previous: state.previous,
                current: state.current,
                elapsed_ns: 0,
            },
        }
    }

    /// `previous × (window − elapsed)`: the previous window's weighted count,
    /// scaled by the window.
    fn carried(&self, view: &View) -> u128 {
        u128::from(view.previous) * u128::from(self.window_ns - view.elapsed_ns)
    }

    /// Unit requests that fit beside `current` and the carried count.
    fn units_free(&self, carried: u128, current: u32) -> u32 {
        let scaled_capacity = u128::from(self.capacity) * u128::from(self.window_ns);
        let whole = scaled_capacity.saturating_sub(carried) / u128::from(self.window_ns);
        // whole <= capacity, a u32.
        to_u32(u64::try_from(whole).unwrap_or(u64::MAX)).saturating_sub(current)
    }

    /// The earliest offset into a window at which `previous` carried from the
    /// window before leaves room for `room` units beside it:
    /// the least `e` with `previous × (window − e) <= room × window`.
    fn earliest_offset_ns(&self, previous: u32, room: u32) -> u64 {
        if previous == 0 {
            return 0;
        }
        let allowed_weight = u128::from(room) * u128::from(self.window_ns) / u128::from(previous);
        let allowed_weight = u64::try_from(allowed_weight).unwrap_or(u64::MAX);
        self.window_ns - allowed_weight.min(self.window_ns)
    }

    /// Time until both windows weigh nothing.
    fn reset_after_ns(&self, previous: u32, current: u32, elapsed_ns: u64) -> u64 {
        if current > 0 {
            2 * self.window_ns - elapsed_ns
        } else if previous > 0 {
            self.window_ns - elapsed_ns
        } else {
            0
        }
    }
}

impl Algorithm for SlidingWindowCounter {
    type State = SlidingWindowCounterState;
    type Admission = SlidingWindowCounterState;

    fn from_quota(quota: &Quota) -> Self {
        Self {
            capacity: quota.burst(),
            window_ns: quota.burst_window_ns(),
        }
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    #[inline]
    fn decide(
        &self,
        state: &SlidingWindowCounterState,
        now_ns: u64,
        cost: u32,
    ) -> Result<Verdict<SlidingWindowCounterState>, CheckError> {
        let cost = validate_cost(cost, self.capacity)?;
        let view = self.view(state, clamp_time(now_ns));
        let carried = self.carried(&view);
        let free = self.units_free(carried, view.current);
        if cost <= free {
            let current = view.current + cost;
            return Ok(Verdict::Allow {
                decision: Decision::allow(
                    self.capacity,
                    free - cost,
                    self.reset_after_ns(view.previous, current, view.elapsed_ns),
                ),
                admission: SlidingWindowCounterState {
                    window_index: view.window_index,
                    previous: view.previous,
                    current,
                },
            });
        }
        let room_now = self.capacity.saturating_sub(view.current);
        let retry_after_ns = if cost <= room_now {
            // Fits in this window once the previous window weighs less.
            // Denied now, so the offset lies beyond `elapsed` (and at most at
            // the window's end, where the previous window weighs nothing).
            self.earliest_offset_ns(view.previous, room_now - cost) - view.elapsed_ns
        } else {
            // Not in this window: in the next, this window's count is carried
            // with weight falling from 1. May exceed one window.
            (self.window_ns - view.elapsed_ns)
                + self.earliest_offset_ns(view.current, self.capacity - cost)
        };
        Ok(Verdict::Deny(Decision::deny(
            self.capacity,
            free,
            retry_after_ns,
            self.reset_after_ns(view.previous, view.current, view.elapsed_ns),
        )))
    }

    #[inline]
    fn admit(&self, state: &mut SlidingWindowCounterState, admission: SlidingWindowCounterState) {
        *state = admission;
    }

    /// A count weighs on the next window too: idle two windows on.
    fn rest_ns(&self) -> u64 {
        2 * self.window_ns
    }

    /// Idle when neither window, rolled forward to now, counts anything.
    fn is_idle(&self, state: &SlidingWindowCounterState, now_ns: u64) -> bool {
        let view = self.view(state, clamp_time(now_ns));
        view.previous == 0 && view.current == 0
    }
}
